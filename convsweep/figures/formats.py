"""The formats figure: each input format's end-to-end time against the batch, beside its floor at the GPU's
measured rates (convsweep.device.floors)."""
from __future__ import annotations

from typing import Any

from convsweep.base.axes import BY_NAME, columns as axis_columns
from convsweep.analysis.reading import PROVENANCE_COLUMNS, Ceilings, MissingData, fastest, provenance
from .drawing import (BATCH_MARKERS, MAX_TICK_LABELS, PANEL_HEIGHT_IN, batch_axis, figure_width, finish,
                      many_batches_note, new_figure, panel_legend, plain_log, runs_note)
from .rows import fetch

# The formats in the axis's order (fp32, fp16, u8, u8-source): the most bytes a pixel first.
FORMAT_ORDER: tuple[str, ...] = tuple(BY_NAME["input_format"].item_schema["enum"])
NEEDS = ("an experiment's `input` key in experiments.yaml lists them: lenet86-input measures "
         f"{', '.join(FORMAT_ORDER)}")


def format_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """The ok runs of `experiment` that have a forward time, with their input format and forward floor."""
    return fetch(url, f"""
        SELECT r.id AS run_id, r.variant, {axis_columns("r")}, r.forward_ms, r.forward_floor_ms,
               {PROVENANCE_COLUMNS}
        FROM latest_run r
        JOIN environment e ON e.id = r.environment_id
        WHERE r.experiment = :experiment AND r.status = 'ok' AND r.forward_ms IS NOT NULL
        ORDER BY r.input_format, r.batch, r.variant, r.id""", {"experiment": experiment})


def draw(rows: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """End-to-end time per input format against the batch, each format's floor dashed beside
    it. One line per format; where a cell (format and batch) has several runs, the fastest."""
    formats = sorted({r["input_format"] for r in rows}, key=_format_order)
    if not formats:
        raise MissingData(f"experiment {experiment!r} has no ok run with a forward time")
    if len(formats) < 2:
        raise MissingData(f"experiment {experiment!r} has ok runs in one input format only ({formats[0]}): the "
                          f"formats figure compares several ({NEEDS})")
    if not any(r["forward_floor_ms"] for r in rows):
        raise MissingData(f"experiment {experiment!r} stores no forward floors: the GPU's rates were never measured "
                          "(`convsweep bench --ceilings-only --db URL` on it, seconds), or its runs predate what the "
                          "floors are reckoned from (sweep it again)")
    best, several = fastest(rows, ("input_format", "batch"), time="forward_ms")
    batches = sorted({b for _, b in best})
    # wider than one panel: the title, centred on the figure, clears the legend beside it
    fig, axes = new_figure(1, 1, figure_width(1) + 1.5, PANEL_HEIGHT_IN + 1.2)
    ax = axes[0][0]
    for k, name in enumerate(formats):
        cells = sorted(((b, run) for (f, b), run in best.items() if f == name), key=lambda cell: cell[0])
        color, marker = f"C{k % 10}", BATCH_MARKERS[k % len(BATCH_MARKERS)]
        ax.plot([b for b, _ in cells], [run["forward_ms"] for _, run in cells], label=name, color=color,
                marker=marker if len(batches) <= MAX_TICK_LABELS else "", linestyle="-", alpha=0.9)
        floors = [(b, run["forward_floor_ms"]) for b, run in cells if run["forward_floor_ms"]]
        if floors:
            ax.plot(*zip(*floors), label=f"{name} floor", color=color, linestyle="--", alpha=0.7)
    batch_axis(ax, batches)
    plain_log(ax, "y")
    ax.set_ylabel("end-to-end time (ms, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    panel_legend(fig, [ax], title="input format")
    timers = sorted({r["timer"] for r in rows})
    how = {"graph": "one replay of the pass captured as a CUDA graph, its launch calls out of it",
           "events": "CUDA events from the first host-to-device copy's start to the last device-to-host copy's end"}
    note = ("End to end: the whole pass host to host, the batch shipped in its format, the device making the "
            "network's input from it, every layer and the logits back; timed as "
            + "; or ".join(how.get(t, t) for t in timers) + ", median over the timed passes. "
            "Floor (dashed): the least the pass could take at this GPU's measured rates (convsweep bench): the "
            "shipped bytes up at the GPU's measured host-to-device rate, the compute, the logits down, pipelined "
            "over the chunks (the longest stage plus the others' share of the smallest chunk)."
            + (" Where a cell has several runs (variants, streams, host memories, settings), the fastest is "
               "shown with its floor." if several else "") + many_batches_note(batches))
    return finish(fig, f"End-to-end time by input format: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


def _format_order(name: str) -> tuple[int, str]:
    return (FORMAT_ORDER.index(name) if name in FORMAT_ORDER else len(FORMAT_ORDER), name)
