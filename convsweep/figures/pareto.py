"""The pareto figure: per conv layer and batch, every setting's op time against its energy per pass, and the
front of those no other setting beats on both (convsweep.analysis.pareto; `convsweep query pareto` lists it)."""
from __future__ import annotations

from typing import Any

from convsweep.analysis.reading import Ceilings, MissingData, provenance
from .drawing import (LEGEND_WIDTH_IN, MAX_COLUMNS, MAX_ROWS, PANEL_HEIGHT_IN, PANEL_WIDTH_IN, finish, new_figure,
                      picked_note, plain_log, side_legend, spread, variant_colors)

FRONT_COLOR = "0.2"
LOG_SPAN = 10  # an axis whose values span this factor or more is logarithmic


def pareto_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """One row per timed ok setting of every conv layer and cell of `experiment` (the latest measurement of each):
    its op time and interval, its energy per pass (None: not measured) and whether it is on its front."""
    from convsweep.analysis.pareto import fronts

    return [{"run_id": p.run_id, "layer_index": front.layer_index, "layer": front.layer, "batch": front.batch,
             "cell": front.cell_text, "variant": p.variant, "setting": p.setting, "op_time_ms": p.op_time_ms,
             "low_ms": p.low_ms, "high_ms": p.high_ms, "energy_per_pass_j": p.energy_per_pass_j,
             "on_front": p.on_front, "status": "ok", "gpu": p.gpu, "profiler": front.cell["profiler"],
             "started_at": p.started_at, "git_commit": p.git_commit, "git_dirty": p.git_dirty}
            for front in fronts(url, experiment) for p in front.points]


def draw(rows: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Each setting's op time against its energy per pass, per conv layer and batch, with the front of the settings
    no other beats on both drawn as a step line. Op time with its 95% interval; colour per variant."""
    from convsweep.analysis.pareto import left_out_line

    measured = [r for r in rows if r["energy_per_pass_j"] is not None]
    if not measured:
        raise MissingData(f"experiment {experiment!r} has no ok run with an energy per pass: a sweep with "
                          "energy_window_s 0 measures none (`convsweep query energy` shows what each job measured)")
    keys = sorted({(r["layer_index"], r["layer"], r["batch"], r["cell"]) for r in measured},
                  key=lambda k: (k[2], str(k[3]), k[0]))
    several_cells = len({k[3] for k in keys}) > 1
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for r in measured:
        by_key.setdefault((r["layer_index"], r["layer"], r["batch"], r["cell"]), []).append(r)
    panels = [(k, by_key[k]) for k in keys]
    alone = sum(len(points) < 2 for _, points in panels)  # a front of one setting among one says nothing
    panels = [(k, points) for k, points in panels if len(points) >= 2]
    if not panels:
        raise MissingData(f"experiment {experiment!r} has no conv layer and batch with two settings or more that "
                          "have an energy per pass: there is no front to draw")
    fronts_drawn = len(panels)
    panels = spread(panels, MAX_COLUMNS * MAX_ROWS)  # more panels wrap: a sweep of many cells stays a page
    colors = variant_colors(r["variant"] for _, points in panels for r in points)
    cols = min(MAX_COLUMNS, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = new_figure(rows_n, cols, PANEL_WIDTH_IN * cols + LEGEND_WIDTH_IN, PANEL_HEIGHT_IN * rows_n + 1.6)
    for n, ((_, layer, batch, cell), points) in enumerate(panels):
        title = f"{layer}, batch {batch}" + (f", {cell}" if several_cells else "")
        _panel(axes[n // cols][n % cols], points, colors, title)
    for n in range(len(panels), rows_n * cols):
        axes[n // cols][n % cols].set_axis_off()
    measured = [r for _, points in panels for r in points]
    _legend(fig, colors)
    settings = len({r["run_id"] for r in measured})
    fronts = {(r["layer_index"], r["batch"], r["cell"]) for r in measured}
    left_out = left_out_line(len({r["run_id"] for r in rows if r["energy_per_pass_j"] is None}))
    if alone:
        left_out = "; ".join(filter(None, [left_out, f"{alone} conv layer and batch with one setting alone left out"]))
    note = (f"{settings} setting{'s' * (settings != 1)} of experiment {experiment} with an energy per pass, the "
            f"latest measurement of each where it is ok (suspect, incorrect and failed ones are never drawn), in "
            f"{len(fronts)} panel{'s' * (len(fronts) != 1)}. x: the panel's conv layer's median op time over the "
            "setting's timed passes, its bar the 95% bootstrap interval over them; y: the run's energy per pass, the "
            "whole GPU's over the timed part (idle gaps included), so the whole pass's, not the layer's. Ringed and "
            "joined by the step line: the front, the settings no other beats on both op time and energy "
            "(`convsweep query pareto` lists them)." + (f" {left_out}." if left_out else "")
            + picked_note(len(panels), fronts_drawn, "conv layers and batches with a front"))
    return finish(fig, f"Op time against energy per pass: {experiment}", f"{provenance(measured)} {note}")


def _panel(ax, points: list[dict[str, Any]], colors: dict[str, str], title: str) -> None:
    """One conv layer and cell: a point per setting with its interval, the front ringed and stepped."""
    if not points:
        ax.text(0.5, 0.5, "no energy measured here", ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.set_axis_off()
        ax.set_title(title, fontsize=10)
        return
    for variant in sorted({p["variant"] for p in points}):
        own = [p for p in points if p["variant"] == variant]
        below = [p["op_time_ms"] - p["low_ms"] if p["low_ms"] is not None else 0.0 for p in own]
        above = [p["high_ms"] - p["op_time_ms"] if p["high_ms"] is not None else 0.0 for p in own]
        ax.errorbar([p["op_time_ms"] for p in own], [p["energy_per_pass_j"] for p in own], xerr=[below, above],
                    color=colors[variant], marker="o", markersize=4, linestyle="none", capsize=2, label=variant,
                    zorder=3)
    front = sorted((p for p in points if p["on_front"]), key=lambda p: (p["op_time_ms"], p["energy_per_pass_j"]))
    xs, ys = [p["op_time_ms"] for p in front], [p["energy_per_pass_j"] for p in front]
    ax.step(xs, ys, where="post", color=FRONT_COLOR, linewidth=1, gid="front", zorder=2)
    ax.plot(xs, ys, linestyle="none", marker="o", markersize=10, markerfacecolor="none",
            markeredgecolor=FRONT_COLOR, gid="front-points", zorder=4)
    ax.set_xlabel(_scaled(ax, "x", [p["op_time_ms"] for p in points], "op time (ms"))
    ax.set_ylabel(_scaled(ax, "y", [p["energy_per_pass_j"] for p in points], "energy per pass (J"))
    ax.set_title(f"{title}: {len(front)} of {len(points)} on the front", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.margins(0.1)


def _scaled(ax, which: str, values: list[float], label: str) -> str:
    """A log axis where the values span a decade or more (variants far apart), else a linear one whose ticks
    read better; its label says which."""
    low, high = min(values), max(values)
    if low > 0 and high / low >= LOG_SPAN:
        plain_log(ax, which)
        return f"{label}, log scale)"
    return f"{label})"


def _legend(fig, colors: dict[str, str]) -> None:
    """Each variant's colour, and how the front is drawn."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=c) for c in colors.values()]
    handles.append(Line2D([], [], color=FRONT_COLOR, linewidth=1, marker="o", markersize=10, markerfacecolor="none",
                          markeredgecolor=FRONT_COLOR))
    side_legend(fig, handles, [*colors, "the front"], title="variant")
