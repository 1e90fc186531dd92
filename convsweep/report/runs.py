"""An experiment's runs read from the store (read-only, through convsweep.analysis.query), and what follows from them
alone: each run's cell, the fastest ok run of each variant and cell, the variants' order and the speedups."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from convsweep.base import axes
from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import json_column
from .coverage import Coverage
from convsweep.analysis.reading import (BASELINE_VARIANT, PROVENANCE_COLUMNS, fastest as fastest_rows)


# What tells two runs of one variant apart besides its tunables, the sweep's axes: (column, heading). A
# column other than batch is shown only where the experiment varies it.
CELL_COLUMNS = tuple((axis.name, axis.heading) for axis in axes.AXES)


RUNS_SQL = f"""
SELECT r.id AS run_id, r.job_id, r.variant, r.params, {axes.columns("r")},
       r.status, r.error, r.checks, r.findings, r.op_time_1_ms, r.op_time_1_spread, r.op_time_2_ms, r.op_time_2_spread,
       r.forward_ms, r.forward_spread, r.forward_floor_ms, r.total_s, r.accuracy, r.profiler,
       conv.op_time_ms, conv.timed_layers, conv.conv_layers, {PROVENANCE_COLUMNS}
FROM latest_run r
JOIN environment e ON e.id = r.environment_id
LEFT JOIN (SELECT run_id, SUM(op_time_ms) AS op_time_ms, COUNT(op_time_ms) AS timed_layers,
                  COUNT(*) AS conv_layers
           FROM layer_time GROUP BY run_id) conv ON conv.run_id = r.id
WHERE r.experiment = :experiment
ORDER BY r.variant, {axes.order_by("r")}, r.id"""


@dataclass
class Experiment:
    """What the report of one experiment is made from: its runs (the latest measurement of each
    setting), its rows of the `why` query and its fronts of op time against energy (convsweep.analysis.pareto)."""

    name: str
    runs: list[dict[str, Any]]
    why_columns: list[str] = field(default_factory=list)
    why: list[dict[str, Any]] = field(default_factory=list)
    fronts: list = field(default_factory=list)
    winners: list[dict[str, Any]] = field(default_factory=list)  # the `winners` query's rows of this experiment
    coverage: Coverage | None = None  # what the sweep asked for and has no result of, where its records say


def _rows(url: str | None, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    from convsweep.analysis.query import fetch_dicts

    return fetch_dicts(url, sql, params)


class NoRuns(ConvsweepError):
    """The experiment has no run stored."""


def load(url: str | None, experiment: str) -> Experiment:
    """The experiment's runs, Nsight Compute rows and fronts; NoRuns when it has no run stored."""
    from convsweep.analysis.pareto import fronts

    _, runs = _rows(url, RUNS_SQL, {"experiment": experiment})
    if not runs:
        raise NoRuns(f"no runs of experiment {experiment!r} in the database: run its sweep first")
    for run in runs:
        run["params"] = json_column(run["params"]) or {}
        # An op time only where every conv layer has one: a partial sum would flatter the run.
        if not run["conv_layers"] or run["timed_layers"] != run["conv_layers"]:
            run["op_time_ms"] = None
    why_columns, why = _rows(url, "why")
    _, winners = _rows(url, "winners")
    return Experiment(experiment, runs, why_columns, [row for row in why if row["experiment"] == experiment],
                      fronts(url, experiment, intervals=False), [row for row in winners if row["experiment"] == experiment])


def cell(run: dict[str, Any]) -> tuple:
    """The run's place in the matrix, its variant aside: its value of each axis."""
    return tuple(run[name] for name in axes.NAMES)


def _cell_order(key: tuple) -> tuple:
    """A cell's place in the tables (axes.sort_key: an automatic chunk size first)."""
    return axes.sort_key(dict(zip(axes.NAMES, key)))


def fastest(runs: Sequence[dict[str, Any]]) -> dict[str, dict[tuple, dict[str, Any]]]:
    """Per variant and cell (axes.CELL_COLUMNS within one experiment), the ok run with the least op time (a
    tuning grid's best setting)."""
    timed = [run for run in runs if run["status"] == "ok" and run["op_time_ms"]]
    best: dict[str, dict[tuple, dict[str, Any]]] = {}
    for run in fastest_rows(timed, ("variant", *axes.NAMES))[0].values():
        best.setdefault(run["variant"], {})[cell(run)] = run
    return best


def variant_order(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The baseline first, then from the slowest variant to the fastest by their speedup over it at
    the largest batch they share; variants sharing no cell with it last, by name."""
    best = fastest(runs)
    baseline = best.get(BASELINE_VARIANT, {})

    def rank(variant: str) -> tuple:
        if variant == BASELINE_VARIANT:
            return (0, 0.0, variant)
        shared = sorted(set(best.get(variant, {})) & set(baseline), key=_cell_order)
        if not shared:
            return (2, 0.0, variant)
        return (1, baseline[shared[-1]]["op_time_ms"] / best[variant][shared[-1]]["op_time_ms"], variant)

    return sorted({run["variant"] for run in runs}, key=rank)


def speedup(best: dict[str, dict[tuple, dict[str, Any]]], over: str | None, run: dict[str, Any]) -> float | None:
    """`over`'s op time in the run's cell (its fastest setting) over the run's, or None."""
    other = best.get(over or "", {}).get(cell(run))
    if other is None or not run["op_time_ms"]:
        return None
    return other["op_time_ms"] / run["op_time_ms"]
