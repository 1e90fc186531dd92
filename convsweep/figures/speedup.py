"""The speedup figure: each variant's op time against the naive baseline's, per conv layer and batch."""
from __future__ import annotations

from typing import Any

from convsweep.base.axes import series_values
from convsweep.analysis.reading import BASELINE_VARIANT, Ceilings, MissingData, fastest, provenance
from .drawing import (MAX_BAR_GROUPS, MAX_BARS, PANEL_HEIGHT_IN, SeriesStyle, figure_width, finish, listed,
                      new_figure, panel_legend, picked_note, plain_log, runs_note, series_styles, spread)
from .rows import conv_layers, timed_layers


def draw(stored: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Each variant's speedup over the naive baseline per conv layer and batch, as bars up (faster)
    or down (slower) from 1× on a log axis."""
    rows = timed_layers(stored, experiment)
    best, several = fastest(rows, ("layer_index", "series", "batch"))
    # The baseline of each series is naive's run set apart the same way (cold over cold, warm over warm).
    baseline = {(i, series_values(r), b): r["op_time_ms"] for (i, _, b), r in best.items()
                if r["variant"] == BASELINE_VARIANT}
    if not baseline:
        raise MissingData(f"experiment {experiment!r} has no ok {BASELINE_VARIANT} run: the speedup is over the "
                          f"{BASELINE_VARIANT} baseline; {_why_no_baseline(stored, experiment)}")
    styles = series_styles(rows)
    others = sorted({r["series"] for r in rows if r["variant"] != BASELINE_VARIANT})
    if not others:
        raise MissingData(f"experiment {experiment!r} has only {BASELINE_VARIANT} runs: no speedup to show")
    speedups = {(i, v, b): baseline[i, series_values(r), b] / r["op_time_ms"] for (i, v, b), r in best.items()
                if r["variant"] != BASELINE_VARIANT and (i, series_values(r), b) in baseline}
    layers = conv_layers(best.values())
    compared = sorted({b for *_, b in baseline})
    batches = spread(compared, MAX_BAR_GROUPS)
    fig, axes = new_figure(1, len(layers), figure_width(len(layers)), PANEL_HEIGHT_IN + 1.4, sharey=True)
    for ax, (index, layer) in zip(axes[0], layers):
        _bars(ax, speedups, index, batches, others, styles)
        ax.set_title(f"{layer} (op time {index + 1})", fontsize=10)
    axes[0][0].set_ylabel(f"speedup over {BASELINE_VARIANT} (×, log scale)")
    panel_legend(fig, axes[0], title="variant")
    unmatched = sorted({b for (_, _, b) in best} - set(compared))
    note = (f"Speedup: the {BASELINE_VARIANT} variant's op time over the variant's, same layer, batch and L2 state; "
            "bars above 1× are faster, below slower."
            + (f" Batches without a {BASELINE_VARIANT} run are left out: {listed(unmatched)}." if unmatched else "")
            + picked_note(len(batches), len(compared), f"batches with a {BASELINE_VARIANT} run")
            + (" Where a variant and batch have several runs, the fastest of each is compared." if several else ""))
    return finish(fig, f"Speedup over {BASELINE_VARIANT} per variant and batch: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment, stored)} {note}")


def _bars(ax, speedups: dict[tuple, float], index: int, batches: list[int], series: list[str],
          styles: dict[str, SeriesStyle]) -> None:
    """Grouped bars from 1×, one group per batch, each labelled with its value (upright when a
    group holds too many bars for the labels to fit side by side)."""
    width = 0.8 / len(series)
    for k, name in enumerate(series):
        xs = [x for x, b in enumerate(batches) if (index, name, b) in speedups]
        values = [speedups[index, name, batches[x]] for x in xs]
        if not xs:
            continue
        bars = ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], [v - 1 for v in values], width=width * 0.9,
                      bottom=1, color=styles[name].color, hatch=styles[name].hatch, edgecolor="white", label=name)
        if len(series) * len(batches) <= MAX_BARS:  # more: no room for a label on each
            ax.bar_label(bars, labels=[f"{v:.3g}×" for v in values], fontsize=7, padding=2,
                         rotation=90 if len(series) > 3 else 0)
    ax.axhline(1, color="0.3", linewidth=0.8)
    plain_log(ax, "y")
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("batch (images)")
    ax.margins(y=0.15)
    ax.grid(True, axis="y", which="both", alpha=0.3)


def _why_no_baseline(stored: list[dict[str, Any]], experiment: str) -> str:
    """What to do about a missing baseline: its runs that failed, or one that never ran (a listed variant that
    a machine without a GPU left out stores nothing, as one not listed)."""
    if any(r["variant"] == BASELINE_VARIANT for r in stored):
        return f"its {BASELINE_VARIANT} runs did not finish ok (`convsweep query failures`)"
    return (f"no {BASELINE_VARIANT} run is stored: add {BASELINE_VARIANT} to its variants, or, where it is listed, "
            f"run it on a GPU (results/{experiment}/not-run.json says why it was left out)")
