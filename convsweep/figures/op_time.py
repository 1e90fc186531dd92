"""The op-time figure: each conv layer's op time against batch, one line per variant."""
from __future__ import annotations

from typing import Any

from convsweep.analysis.reading import Ceilings, fastest, provenance
from .drawing import (MAX_TICK_LABELS, PANEL_HEIGHT_IN, batch_axis, figure_width, finish, many_batches_note,
                      new_figure, panel_legend, plain_log, runs_note, series_styles)
from .rows import conv_layers, timed_layers


def draw(stored: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Each conv layer's op time against batch, one line per variant, both axes log."""
    rows = timed_layers(stored, experiment)
    best, several = fastest(rows, ("layer_index", "series", "batch"))
    layers = conv_layers(best.values())
    batches = sorted({r["batch"] for r in best.values()})
    styles = series_styles(rows)
    markers = {"marker": "o", "markersize": 7} if len(batches) <= MAX_TICK_LABELS else {"marker": ""}  # else a line
    fig, axes = new_figure(1, len(layers), figure_width(len(layers)), PANEL_HEIGHT_IN + 1.2)
    lines: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for (i, series, b), r in best.items():
        lines.setdefault((i, series), []).append((b, r["op_time_ms"]))
    for ax, (index, layer) in zip(axes[0], layers):
        for series, style in styles.items():
            points = sorted(lines.get((index, series), []))
            if points:
                ax.plot(*zip(*points), **markers, linestyle=style.linestyle, label=series,
                        **style.marker_colors())
        batch_axis(ax, batches)
        plain_log(ax, "y")
        ax.set_ylabel("op time (ms, log scale)")
        ax.set_title(f"{layer} (op time {index + 1})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    panel_legend(fig, axes[0], title="variant")
    note = ("Op time: the GPU time of the layer's kernels (nsys, else CUDA events), median over the timed passes."
            + (" Where a variant and batch have several runs (tunable settings, streams, host memory), the fastest "
               "is shown." if several else "") + many_batches_note(batches))
    return finish(fig, f"Op time per variant and batch: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment, stored)} {note}")
