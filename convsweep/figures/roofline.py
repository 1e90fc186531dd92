"""The roofline figure: achieved GFLOP/s against arithmetic intensity per conv layer, under the
device's measured ceilings when a bench file gives them."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from convsweep.analysis.reading import Ceilings, MissingData, fastest, provenance
from .drawing import (BATCH_MARKERS, PANEL_HEIGHT_IN, VARIANT_LINESTYLES, SeriesStyle, figure_width, finish,
                      new_figure, plain_log, runs_note, series_styles, side_legend)
from .rows import conv_layers, timed_layers

FLOOR_BYTES = "floor bytes"
NCU_BYTES = "DRAM bytes"
NCU_BYTES_MEANING = "DRAM bytes: what Nsight Compute measured the layer's kernels read and write, one pass"
FLOOR_BYTES_MEANING = ("floor bytes: what the layer must move at least, its input, weights, bias and output once "
                       "each, not measured DRAM traffic")


def draw(stored: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Achieved GFLOP/s against arithmetic intensity per conv layer, one point per variant and
    batch, under the bench file's copy-bandwidth and matmul ceilings when one is given."""
    rows = [r for r in timed_layers(stored, experiment) if r["flops"] and roofline_bytes(r)[0]]
    if not rows:
        raise MissingData(f"experiment {experiment!r} stores no flops and bytes floors for its conv layers")
    best, several = fastest(rows, ("layer_index", "series", "batch"))
    layers = conv_layers(best.values())
    styles = series_styles(rows)
    batches = sorted({r["batch"] for r in best.values()})
    # A marker per batch while the markers last; past them, every point a small dot of its variant's colour.
    marked = len(batches) <= len(BATCH_MARKERS)
    markers = {b: BATCH_MARKERS[i] for i, b in enumerate(batches)} if marked else {}
    sources = sorted({roofline_bytes(r)[1] for r in best.values()})
    fig, axes = new_figure(1, len(layers), figure_width(len(layers)), PANEL_HEIGHT_IN + 1.6,
                           sharex=True, sharey=True)
    for ax, (index, layer) in zip(axes[0], layers):
        if marked:
            for (i, variant, batch), row in sorted(best.items()):
                if i == index:
                    _point(ax, row, markers[batch], batches.index(batch), styles[variant])
        else:
            _dots(ax, [row for (i, _, _), row in best.items() if i == index], styles)
        ax.set_title(f"{layer} (op time {index + 1})", fontsize=10)
        ax.set_xlabel(f"arithmetic intensity (FLOP/byte, {' or '.join(sources)})")
        plain_log(ax, "x")
        plain_log(ax, "y")
        ax.margins(x=0.4)  # points of one layer share an intensity: room around them (ceilings widen it)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("achieved GFLOP/s (log scale)")
    roof_handles = _draw_ceilings(axes[0], ceilings, best.values()) if ceilings else []
    _legend(fig, styles, markers, roof_handles)
    meanings = "; ".join(NCU_BYTES_MEANING if source == NCU_BYTES else FLOOR_BYTES_MEANING for source in sources)
    if len(sources) > 1:
        meanings += "; a black rim marks a point over DRAM bytes"
    note = (f"Intensity: the layer's FLOPs over its {' or '.join(sources)} ({meanings}). "
            + _ceilings_note(ceilings, rows)
            + (" Where a variant and batch have several runs, the fastest is shown." if several else "")
            + ("" if marked else f" {len(batches):,} batches, more than the {len(BATCH_MARKERS)} a marker tells apart: "
               "each variant's batches are dots of its colour."))
    return finish(fig, f"Roofline per conv layer: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment, stored)} {note}")


def roofline_bytes(row: dict[str, Any]) -> tuple[int | None, str]:
    """The bytes a roofline point's intensity divides by, and what they are: the DRAM traffic
    Nsight Compute measured for the layer's kernels when the setting was profiled, else its floor."""
    if row.get("dram_bytes"):
        return row["dram_bytes"], NCU_BYTES
    return row["bytes"], FLOOR_BYTES


def _point(ax, row: dict[str, Any], marker: str, place: int, style: SeriesStyle) -> None:
    """One variant at one batch; larger batches get smaller markers drawn on top, so points that
    coincide (as a batch's times often scale with it) still show each one's rim."""
    nbytes, source = roofline_bytes(row)
    colors = style.marker_colors()
    if source == NCU_BYTES:  # a black rim: the intensity divides by measured DRAM traffic, not the floor
        colors["markeredgecolor"] = "black"
    ax.plot(row["flops"] / nbytes, row["flops"] / (row["op_time_ms"] * 1e6), ls="", marker=marker,
            markersize=max(8.0, 13.0 - 2.5 * place), markeredgewidth=2.0 if source == NCU_BYTES else 1.0,
            zorder=3 + place, **colors)


def _dots(ax, rows: list[dict[str, Any]], styles: dict[str, SeriesStyle]) -> None:
    """Many batches: each series' points as one line of small dots (a rim where the bytes were measured)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["series"], roofline_bytes(row)[1]), []).append(row)
    for (series, source), points in sorted(groups.items()):
        colors = styles[series].marker_colors()
        if source == NCU_BYTES:
            colors["markeredgecolor"] = "black"
        ax.plot([r["flops"] / roofline_bytes(r)[0] for r in points],
                [r["flops"] / (r["op_time_ms"] * 1e6) for r in points], ls="", marker="o", markersize=3,
                markeredgewidth=0.5, alpha=0.8, zorder=3, **colors)


def _draw_ceilings(axes, ceilings: Ceilings, rows: Iterable[dict[str, Any]]) -> list:
    """The memory roof (copy GB/s x intensity) and one flat roof per matmul rate, over an
    intensity range that holds the points and every ridge."""
    intensities = [r["flops"] / roofline_bytes(r)[0] for r in rows]
    peaks_gflops = {mode: tflops * 1e3 for mode, tflops in sorted(ceilings.matmul_tflops.items(),
                                                                  key=lambda item: item[1])}
    ridges = [gflops / ceilings.copy_gbps for gflops in peaks_gflops.values()]
    lo, hi = min(intensities + ridges) / 4, max(intensities + ridges) * 4
    roof_end = min(hi, max(ridges, default=hi))  # the memory roof rises until the highest compute roof
    handles = []
    for ax in axes:
        handles = ax.plot([lo, roof_end], [ceilings.copy_gbps * lo, ceilings.copy_gbps * roof_end], color="0.15",
                          linewidth=1.5, label=f"device copy {ceilings.copy_gbps:.0f} GB/s")
        for k, (mode, gflops) in enumerate(peaks_gflops.items()):
            handles += ax.plot([gflops / ceilings.copy_gbps, hi], [gflops, gflops], color="0.15",
                               linestyle=VARIANT_LINESTYLES[(k + 1) % len(VARIANT_LINESTYLES)], linewidth=1.2,
                               label=f"{mode} matmul {gflops / 1e3:.1f} TFLOP/s")
        ax.set_xlim(lo, hi)
    return handles


def _legend(fig, styles: dict[str, SeriesStyle], markers: dict[int, str], roof_handles: list) -> None:
    """One legend at the side: variants by color, batches by marker, then the ceilings."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", markersize=8, **style.marker_colors()) for style in styles.values()]
    handles += [Line2D([], [], ls="", marker=m, markersize=8, color="0.4") for m in markers.values()]
    labels = list(styles) + [f"batch {b}" for b in markers]
    side_legend(fig, handles + roof_handles, labels + [h.get_label() for h in roof_handles],
                title="variant, batch, ceiling" if markers else "variant, ceiling")


def _ceilings_note(ceilings: Ceilings | None, rows: Sequence[dict[str, Any]]) -> str:
    if ceilings is None:
        return ("No ceilings drawn: give --bench FILE (the JSON of `convsweep bench --json FILE`) for the device's "
                "measured copy bandwidth and matmul rates.")
    gpus = {r["gpu"] for r in rows}
    elsewhere = (f" The bench ran on {ceilings.device}, not on the GPU of these runs."
                 if ceilings.device and gpus and ceilings.device not in gpus else "")
    matmul = "" if ceilings.matmul_tflops else \
        " It holds no matmul rates (PyTorch was not installed), so no compute roof."
    return (f"Ceilings measured by convsweep bench ({ceilings.source}): device-to-device copy (read + write) and "
            f"matmul rates.{matmul}{elsewhere}")
