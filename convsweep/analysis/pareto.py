"""Op time against energy per pass: per conv layer and cell, the settings no other setting beats on both.

A front is drawn per experiment, conv layer and cell (compare's CELL but the variant: batch, the other axes, the
profiler, network and dataset), over the latest measurement of each setting where it is ok (suspect, incorrect
and failed ones never count, as in `best`). A setting is a point: the layer's median op time over its stored
samples, with that median's 95% bootstrap interval (history.point_interval), against the run's energy per pass
(the whole GPU's over the timed part, so the pass's, not the layer's). Lower is better on both; a point is on the
front when no other point is at least as good on both and better on one. Runs without energy (a sweep with
energy_window_s 0, a GPU without NVML's counter) have no place on it and are counted in a line; CPU-timed runs,
which never have one, are left out.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from convsweep.base.axes import AXES
from .compare import CELL, stored_samples
from convsweep.sweep.config import tunables_text
from convsweep.base.errors import StoreError
from convsweep.base.fileio import json_column
from .history import point_interval
from convsweep.base.numbers import median
from .query import fetch_dicts
from .reading import PROVENANCE_COLUMNS

# What a front holds fixed besides the layer: compare's cell, but the variant (the variants are what compete).
FRONT_CELL = tuple(column for column in CELL if column not in ("variant", "variants"))
# Cell columns named in a front's cell text only where fronts of one experiment, layer and batch differ in them.
_IMPLICIT = ("profiler", "network", "dataset")

_SETTINGS_SQL = f"""
    SELECT r.id AS run_id, {", ".join(f"r.{c}" for c in FRONT_CELL)}, r.variant, r.params, r.energy_per_pass_j,
           lt.layer_index, lt.layer, lt.op_time_ms, {PROVENANCE_COLUMNS}
    FROM layer_time lt
    JOIN latest_run r ON r.id = lt.run_id
    JOIN environment e ON e.id = r.environment_id
    WHERE r.status = 'ok' AND COALESCE(r.profiler, '') <> 'cpu'{{experiment}}
    ORDER BY r.experiment, lt.layer_index, r.id"""


@dataclass(frozen=True)
class Point:
    """One setting at one conv layer: its run, variant label and tunables text, the layer's median op time with
    its 95% interval (None: fewer than stats.MIN_SAMPLES samples, or not asked for), the run's energy per pass
    (None: not measured) and whether it is on the front; where and when it was measured, for captions."""

    run_id: int
    variant: str
    setting: str
    op_time_ms: float
    low_ms: float | None
    high_ms: float | None
    energy_per_pass_j: float | None
    on_front: bool
    gpu: str | None = None
    started_at: Any = None
    git_commit: str | None = None
    git_dirty: bool | None = None


@dataclass
class Front:
    """One experiment, conv layer and cell (FRONT_CELL's values) and its timed ok settings, fastest first;
    `cell_text` names what tells it apart from the other fronts of its layer and batch ('s1 pageable')."""

    layer_index: int
    layer: str
    cell: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    cell_text: str = ""

    @property
    def experiment(self) -> str:
        return self.cell["experiment"]

    @property
    def batch(self) -> int:
        return self.cell["batch"]

    @property
    def measured(self) -> list[Point]:
        """The settings with an energy per pass: those the front is taken over."""
        return [p for p in self.points if p.energy_per_pass_j is not None]

    @property
    def front(self) -> list[Point]:
        return [p for p in self.points if p.on_front]


def non_dominated(points: Sequence[tuple[float, float]]) -> list[bool]:
    """Whether each (op time, energy) point is on the front, lower being better on both: no other point is at
    least as good on both and better on one. Two equal points are both on it. A sweep in op time order keeps
    each point whose energy is below that of every faster one."""
    on = [False] * len(points)
    least, last = float("inf"), None
    for i in sorted(range(len(points)), key=lambda i: points[i]):
        if points[i][1] < least or points[i] == last:
            on[i], least, last = True, points[i][1], points[i]
    return on


def fronts(url: str | None, experiment: str | None = None, intervals: bool = True) -> list[Front]:
    """Every front (of one experiment, or all), in experiment, layer and cell order, each with every timed ok
    setting of its latest measurements, those without energy included (not on it). `intervals`: bootstrap each
    point's interval (the report, which names the front's variants only, does without)."""
    _, rows = fetch_dicts(url, _SETTINGS_SQL.format(experiment=" AND r.experiment = :experiment" if experiment
                                                    else ""), {"experiment": experiment} if experiment else None)
    samples = stored_samples(url, sorted({row["run_id"] for row in rows}))
    found: dict[tuple, Front] = {}
    for row in rows:
        values = samples.get(row["layer"], {}).get(row["run_id"], [])
        op_time_ms = median(values) if values else row["op_time_ms"]
        if not op_time_ms:
            continue  # a layer no timer split out (a graph-timed pass): no time of its own
        cell = {column: row[column] for column in FRONT_CELL}
        front = found.setdefault((row["layer_index"], json.dumps(cell, sort_keys=True, default=str)),
                                 Front(row["layer_index"], row["layer"], cell))
        low, high = point_interval(values) if intervals and row["energy_per_pass_j"] is not None else (None, None)
        front.points.append(Point(row["run_id"], row["variant"], tunables_text(json_column(row["params"]) or {}),
                                  op_time_ms, low, high, row["energy_per_pass_j"], False, row["gpu"],
                                  row["started_at"], row["git_commit"],
                                  None if row["git_dirty"] is None else bool(row["git_dirty"])))
    ordered = sorted(found.values(), key=_order)
    for front in ordered:
        measured = front.measured
        on = dict(zip((p.run_id for p in measured),
                      non_dominated([(p.op_time_ms, cast(float, p.energy_per_pass_j)) for p in measured])))
        front.points = sorted((replace(p, on_front=on.get(p.run_id, False)) for p in front.points),
                              key=lambda p: (p.op_time_ms, p.run_id))
    _name_cells(ordered)
    return ordered


def _order(front: Front) -> tuple:
    return (front.experiment, front.layer_index, *((front.cell[a.name] is not None, front.cell[a.name]) for a in AXES),
            *(str(front.cell[c]) for c in _IMPLICIT))


def _name_cells(found: list[Front]) -> None:
    """Each front's cell text: the axes but batch as job ids name them ('s1 pageable cold'), and the profiler,
    network or dataset where two fronts of one experiment, layer and batch differ in it."""
    together: dict[tuple, list[Front]] = {}
    for front in found:
        together.setdefault((front.experiment, front.layer_index, front.batch), []).append(front)
    for group in together.values():
        varied = [c for c in _IMPLICIT if len({str(f.cell[c]) for f in group}) > 1]
        for front in group:
            parts = [part[1:] for axis in AXES if axis.name != "batch"
                     and (part := axis.id_part(front.cell[axis.name]))]
            parts += [Path(str(front.cell[c])).stem if c == "network" else str(front.cell[c]) for c in varied]
            front.cell_text = " ".join(parts)


def without_energy(found: Sequence[Front]) -> int:
    """How many settings (runs) have a timed ok layer but no energy per pass."""
    return len({p.run_id for front in found for p in front.points if p.energy_per_pass_j is None})


def left_out_line(count: int) -> str | None:
    """The line saying that `count` settings were left out for want of an energy per pass; None for none."""
    if not count:
        return None
    return (f"{count} ok setting{'s' * (count != 1)} without an energy per pass left out (a sweep with "
            "energy_window_s 0 measures none, nor does a GPU without NVML's energy counter)")


PARETO_COLUMNS = ["experiment", "layer", "batch", "cell", "variant", "setting", "op time (ms)", "low (ms)",
                  "high (ms)", "energy per pass (J)", "front/settings", "run"]


def pareto(url: str | None, params: dict[str, str] | None = None) -> tuple[list[str], list[list[Any]]]:
    """`convsweep query pareto`: one row per setting on each front, fastest first, with the front's size over
    the settings with an energy per pass. --param experiment=NAME keeps one experiment."""
    found = fronts(url, _experiment(params))
    rows = [[f.experiment, f.layer, f.batch, f.cell_text, p.variant, p.setting, p.op_time_ms, p.low_ms, p.high_ms,
             p.energy_per_pass_j, f"{len(f.front)}/{len(f.measured)}", p.run_id]
            for f in found for p in f.front]
    return PARETO_COLUMNS, rows


def pareto_note(url: str | None, params: dict[str, str] | None = None) -> str | None:
    """What `convsweep query pareto` left out for want of energy, as a line to show beside its table."""
    return left_out_line(without_energy(fronts(url, _experiment(params), intervals=False)))


def _experiment(params: dict[str, str] | None) -> str | None:
    params = dict(params or {})
    unknown = sorted(set(params) - {"experiment"})
    if unknown:
        raise StoreError(f"pareto: unknown --param {unknown[0]}: expected experiment")
    return params.get("experiment")


def front_section(fronts: Sequence[Front]) -> list:
    """Per conv layer and batch, the variants on the front of op time against energy per pass, fastest first;
    nothing where no setting has an energy per pass: the report's section."""
    from convsweep.base.document import Heading, Paragraph, Table

    measured = [front for front in fronts if front.measured]
    if not measured:
        return []
    several = len({front.cell_text for front in measured}) > 1
    rows = [[front.layer, str(front.batch), *([front.cell_text] if several else []), _front_variants(front.front),
             f"{len(front.front)}/{len(front.measured)}"] for front in measured]
    left_out = left_out_line(without_energy(fronts))
    return [Heading(2, "Op time against energy"),
            Paragraph("Per conv layer and batch, the variants with a setting on the front, fastest first: the settings "
                      "no other setting beats on both the layer's op time and the energy per pass (the whole GPU's, "
                      "per pass); front/settings counts them among the settings with an energy. `convsweep query "
                      "pareto` lists them with their op time intervals." + (f" {left_out}." if left_out else "")),
            Table(["layer", "batch", *(["cell"] if several else []), "on the front", "front/settings"], rows,
                  [False, True, *([False] if several else []), False, True])]


def _front_variants(front: Sequence) -> str:
    """'`tiled` (2 settings), `naive`': the front's variants in its order, fastest first."""
    counts: dict[str, int] = {}
    for point in front:
        counts[point.variant] = counts.get(point.variant, 0) + 1
    return ", ".join(f"`{variant}`" + (f" ({n} settings)" if n > 1 else "") for variant, n in counts.items())
