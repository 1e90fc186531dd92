"""The report's tables as data: the seeds' and the why CSV rows, and summary.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from convsweep.base import axes
from convsweep.base.document import to_markdown
from .coverage import section as coverage_section
from convsweep.analysis.reading import (BASELINE_VARIANT, whole_network)
from convsweep.base.numbers import rounded, rounded_percent

from .cells import spread, tunables
from .runs import CELL_COLUMNS, Experiment, _cell_order, cell, fastest, speedup, variant_order
from .sections import _checks, failure_groups, fast_checks, runs_text, several_settings, shown_columns


SEEDS_CSV_COLUMNS = ["variant", "tunables", *(heading for _, heading in CELL_COLUMNS), "status", "checks",
                     "op time 1 (ms)", "op time 1 ±%", "op time 2 (ms)", "op time 2 ±%", "op time (ms)",
                     "forward (ms)", "forward ±%", "total (s)", "accuracy", "previous", "× over previous",
                     f"× over {BASELINE_VARIANT}", "error"]


def seeds_rows(experiment: Experiment) -> list[list[Any]]:
    """Every run of the experiment with its speedups (an ok run's: a suspect, incorrect or failed run's time
    counts for nothing), in report order: the CSV beside the report."""
    order = variant_order(experiment.runs)
    best = fastest(experiment.runs)
    rows = []
    for index, variant in enumerate(order):
        previous = order[index - 1] if index > 0 else None
        for run in sorted((r for r in experiment.runs if r["variant"] == variant),
                          key=lambda r: (_cell_order(cell(r)), r["status"] != "ok", r["op_time_ms"] or 0)):
            rows.append([variant, tunables(run["params"]), *cell(run), run["status"], run["checks"],
                         run["op_time_1_ms"], rounded_percent(run["op_time_1_spread"]),
                         run["op_time_2_ms"], rounded_percent(run["op_time_2_spread"]), run["op_time_ms"],
                         run["forward_ms"], rounded_percent(run["forward_spread"]), run["total_s"], run["accuracy"],
                         previous, *(rounded(speedup(best, over, run)) if run["status"] == "ok" else None
                                     for over in (previous, BASELINE_VARIANT)),
                         run["error"]])
    return rows


def why_rows(experiment: Experiment) -> list[list[Any]]:
    return [[row[c] for c in experiment.why_columns] for row in experiment.why]


SUMMARY_INTRO = ("The latest measurement of each job's settings (`convsweep query history` has them all); ±% is "
                 "the spread of the median's samples (median absolute deviation over the median).")


SUSPECT_INTRO = ("Their outputs are right, but the integrity checks doubt their times: they are in the table above "
                 "and never count as the fastest.")


def summary_markdown(experiment: Experiment) -> str:
    """summary.md: every run of the experiment in one table (a grid's settings each on its row, with
    the tunables that tell them apart, where a variant ran at several; how each was checked, where one
    was measured with fast checks), then its failed or incorrect runs, then its suspect ones with why."""
    from convsweep.analysis.query import render

    grid = any(several_settings([run for run in experiment.runs if run["variant"] == variant])
               for variant in {run["variant"] for run in experiment.runs})
    runs = sorted(experiment.runs, key=lambda r: (r["variant"], axes.sort_key(r), r["forward_ms"] is None,
                                                   r["forward_ms"] or 0.0))
    cell_axes = axes.shown(experiment.runs)
    marked = any(fast_checks(run) for run in runs)
    columns = ["variant", *(["setting"] if grid else []), *cell_axes, "status", *(["checks"] if marked else []),
               "op_time_1_ms", "op time 1 ±%", "op_time_2_ms", "op time 2 ±%", "forward_ms", "forward ±%",
               "total_s", "accuracy"]
    rows = [[run["variant"], *([tunables(run["params"])] if grid else []), *(run[name] for name in cell_axes), run["status"],
             *([_checks(run)] if marked else []), run["op_time_1_ms"], spread(run["op_time_1_spread"]),
             run["op_time_2_ms"], spread(run["op_time_2_spread"]), run["forward_ms"], spread(run["forward_spread"]),
             run["total_s"], run["accuracy"]] for run in runs]
    text = f"# {experiment.name}\n\n{SUMMARY_INTRO}\n\n{render(columns, rows, 'table')}\n"
    whole = sorted({run["variant"] for run in runs if whole_network(run["variant"])})
    if whole:
        text += (f"\n{', '.join(whole)} {'runs' if len(whole) == 1 else 'run'} the whole network in one kernel: "
                 "op time 1 is every layer's time, and op time 2 is empty.\n")
    shown = shown_columns(experiment.runs)
    failed = [run for run in runs if run["status"] not in ("ok", "suspect")]
    if failed:  # one row per cause: the table above has each run's status
        rows = [[runs_text(group, shown, grid, variants=True), status, error]
                for (status, error), group in failure_groups(failed).items()]
        text += f"\n## Failed or incorrect\n\n{render(['runs', 'status', 'error'], rows, 'table')}\n"
    suspect = [run for run in runs if run["status"] == "suspect"]
    if suspect:
        rows = [[runs_text(group, shown, grid, variants=True), error]
                for (_, error), group in failure_groups(suspect).items()]
        text += (f"\n## Suspect\n\n{SUSPECT_INTRO}\n\n{render(['runs', 'why'], rows, 'table')}\n")
    if coverage := coverage_section(experiment.coverage, runs, "in Failed or incorrect above"):
        text += "\n" + to_markdown(coverage, Path("."))
    return text
