"""The streams figure: forward time and copy/kernel overlap against the number of CUDA streams."""
from __future__ import annotations

from typing import Any

from convsweep.base.axes import columns as axis_columns
from convsweep.analysis.reading import PROVENANCE_COLUMNS, Ceilings, MissingData, fastest, provenance
from .drawing import (BATCH_MARKERS, MAX_COLUMNS, PANEL_HEIGHT_IN, VARIANT_LINESTYLES, figure_width, finish,
                      new_figure, panel_legend, picked_note, plain_log, runs_note, spread)
from .rows import fetch

def stream_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """The ok runs of `experiment` that have a forward time, with their streams, host memory and overlap."""
    return fetch(url, f"""
        SELECT r.id AS run_id, r.variant, {axis_columns("r")}, r.forward_ms, r.overlap,
               {PROVENANCE_COLUMNS}
        FROM latest_run r
        JOIN environment e ON e.id = r.environment_id
        WHERE r.experiment = :experiment AND r.status = 'ok' AND r.forward_ms IS NOT NULL
        ORDER BY r.variant, r.batch, r.host_memory, r.streams, r.id""", {"experiment": experiment})


def draw(rows: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Forward time and copy/kernel overlap against stream count, one panel column per batch and
    one line per variant and host-memory kind."""
    best, several = fastest(rows, ("variant", "batch", "host_memory", "streams"), time="forward_ms")
    counts: dict[tuple, set[int]] = {}
    for variant, batch, memory, streams in best:
        counts.setdefault((variant, batch, memory), set()).add(streams)
    if not any(len(s) > 1 for s in counts.values()):
        raise MissingData(f"experiment {experiment!r} has no ok runs at several stream counts "
                          "(sweeps/streams.yaml measures 1/2/4/8)")
    # A column per batch measured at several stream counts: one point per line says nothing here.
    every_batch = sorted({b for (_, b, _), streams in counts.items() if len(streams) > 1})
    batches = spread(every_batch, MAX_COLUMNS)
    memories = sorted({m for _, _, m in counts}, key=_memory_order)
    variants = sorted({v for v, _, _ in counts})
    fig, axes = new_figure(2, len(batches), figure_width(len(batches)), 2 * PANEL_HEIGHT_IN + 1.0, sharex=True)
    for col, batch in enumerate(batches):
        for (variant, b, memory), streams in counts.items():
            if b == batch:
                k = variants.index(variant)
                style = {"color": f"C{memories.index(memory) % 10}", "marker": BATCH_MARKERS[k % len(BATCH_MARKERS)],
                         "linestyle": VARIANT_LINESTYLES[k % len(VARIANT_LINESTYLES)]}
                _lines(axes[:, col], best, (variant, batch, memory), sorted(streams), style)
        _axes(axes[:, col], batch, sorted({s for *_, s in best}))
    axes[0][0].set_ylabel("forward time (ms, log scale)")
    axes[1][0].set_ylabel("copy time hidden under kernels (%)")
    panel_legend(fig, axes.flat, title="variant, host memory")
    note = ("Forward: first host-to-device copy start to last device-to-host copy end, median over the timed passes. "
            "Overlap: the share of copy time hidden under kernels (nsys; none without it)."
            + (" Where a cell has several runs (tunable settings, chunk sizes), the fastest is shown."
               if several else "") + picked_note(len(batches), len(every_batch), "batches at several stream counts"))
    return finish(fig, f"Forward time and overlap against streams: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


def _memory_order(memory: str) -> tuple[int, str]:
    order = ("pageable", "pinned", "registered")
    return (order.index(memory) if memory in order else len(order), memory)


def _lines(axes, best: dict[tuple, dict[str, Any]], cell: tuple, streams: list[int], style: dict[str, str]) -> None:
    """One cell's forward time (top) and overlap in % (bottom) against its stream counts; color
    says the host memory, marker and line the variant, so lines that coincide stay told apart."""
    runs = [best[cell + (s,)] for s in streams]  # mypy's parser takes (*cell, s) here for 3.11's star index
    label = f"{cell[0]}, {cell[2]}"
    axes[0].plot(streams, [r["forward_ms"] for r in runs], label=label, alpha=0.85, **style)
    overlap = [(s, 100 * r["overlap"]) for s, r in zip(streams, runs) if r["overlap"] is not None]
    if overlap:
        axes[1].plot(*zip(*overlap), label=label, alpha=0.85, **style)


def _axes(axes, batch: int, streams: list[int]) -> None:
    axes[0].set_title(f"batch {batch}", fontsize=10)
    plain_log(axes[0], "y")
    axes[1].set_ylim(-5, 105)
    if not axes[1].lines:
        axes[1].text(0.5, 0.5, "no overlap measured (timed without nsys)", ha="center", va="center",
                     transform=axes[1].transAxes, color="0.4")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(s) for s in streams])
        ax.set_xticks([], minor=True)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].set_xlabel("CUDA streams")
