"""`convsweep replay`: search strategies judged offline, against grids measured whole. Each job of a stored grid
is a space whose every setting's time is known; a strategy searches it as a job would (convsweep.sweep.search), but
each setting it asks for is answered from the stored medians, so no GPU is needed and a strategy's luck can be
told from its skill over many seeds. It reports how often the strategy came within 2% of the grid's best, and
after how many settings.

The grids come from the database (the latest measurement of each setting of a grid-searched job) or from a
grids file that `replay --save` writes of them: small enough to commit, so that CI replays a real GPU's grid.
A grids file is checked whole (load_grids) before any strategy is replayed: no verdict comes of a broken one.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from convsweep.base.errors import ConfigError, ConvsweepError, StoreError
from convsweep.base.fileio import write_json_atomic

GRIDS_FORMAT = "convsweep-grids-1"
# The committed grids files are 94 KB (298 settings) and 452 KB (1,250): this is ~45,000 settings, more than replay
# can search over many seeds in a sitting. Checked before the file is parsed (store.strict_json.read_json).
MAX_GRIDS_BYTES = 16 * 2**20
TOLERANCE = 0.02  # within 2% of the grid's best
DEFAULT_BUDGET = "20%"
DEFAULT_SEEDS = 20
MIN_OK = 2  # a job with fewer ok settings has nothing to search


@dataclass(frozen=True)
class Grid:
    """One job's whole grid: each setting's tunables and each conv layer's median op time (None where the
    setting failed, came out wrong or is suspect), and `groups`, the layers whose tunables move together."""

    job: str
    variant: str
    batch: int | None
    params: list[dict[str, dict]]
    layer_ms: list[dict[str, float] | None]
    groups: list[list[str]]

    @property
    def op_time_ms(self) -> list[float | None]:
        """Each setting's Op Time: its conv layers' op times added up."""
        return [sum(t.values()) if t else None for t in self.layer_ms]

    @property
    def best_ms(self) -> float:
        return min(t for t in self.op_time_ms if t is not None)

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "variant": self.variant, "batch": self.batch, "groups": self.groups,
                "settings": [{"params": p, "layer_ms": t} for p, t in zip(self.params, self.layer_ms)]}


def tied_groups(params: Sequence[dict[str, dict]]) -> list[list[str]]:
    """The layers whose tunables are equal in every setting move together (a variant's grid that ties them);
    each other layer is a group of its own."""
    groups: list[list[str]] = []
    for layer in dict.fromkeys(layer for p in params for layer in p):
        for group in groups:
            if all(p.get(group[0]) == p.get(layer) for p in params):
                group.append(layer)
                break
        else:
            groups.append([layer])
    return groups


def stored_grids(db: str | None, experiment: str) -> list[Grid]:
    """The grid-searched jobs of `experiment` whose every valid setting is stored, with each setting's latest
    measurement; one line when there is none."""
    from .query import fetch_dicts

    _, runs = fetch_dicts(db, "SELECT id, job_key, job_id, variant, batch, params, status, grid FROM latest_run "
                              "WHERE experiment = :experiment ORDER BY job_key, id", {"experiment": experiment})
    if not runs:
        raise ConvsweepError(f"replay: no stored run of experiment {experiment!r}")
    _, layers = fetch_dicts(db, "SELECT l.run_id, l.layer, l.op_time_ms FROM layer_time l JOIN latest_run r "
                                "ON r.id = l.run_id WHERE r.experiment = :experiment", {"experiment": experiment})
    times: dict[int, dict[str, float | None]] = {}
    for row in layers:
        times.setdefault(row["run_id"], {})[row["layer"]] = row["op_time_ms"]
    jobs: dict[str, list[dict]] = {}
    for run in runs:
        jobs.setdefault(run["job_key"], []).append(run)
    grids = []
    for members in jobs.values():
        place = [_json(m["grid"]) or {} for m in members]
        if any((p.get("search") or {}).get("strategy") != "grid" for p in place) or \
                len({p.get("index") for p in place}) != (place[0].get("valid") or -1):
            continue  # a sample, a guided search, or a grid not wholly stored: not a known space
        members.sort(key=lambda m: _json(m["grid"])["index"])
        params = [_json(m["params"]) or {} for m in members]
        layer_ms = []
        for m in members:
            t = times.get(m["id"]) or {}
            ok = m["status"] == "ok" and t and all(v is not None for v in t.values())
            layer_ms.append({layer: float(cast(float, v)) for layer, v in t.items()} if ok else None)
        grids.append(Grid(members[0]["job_id"], members[0]["variant"], members[0]["batch"], params, layer_ms,
                          tied_groups(params)))
    if not grids:
        raise ConvsweepError(f"replay: experiment {experiment!r} has no job whose whole grid is stored "
                             "(search: grid, every valid setting measured)")
    return grids


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def save_grids(path: str | Path, experiment: str, grids: Sequence[Grid], source: str) -> None:
    write_json_atomic(path, {"format": GRIDS_FORMAT, "experiment": experiment, "source": source,
                             "jobs": [grid.to_json() for grid in grids]})


def _name(what: str) -> dict:
    # No lone UTF-16 surrogate (a JSON escape can make one): printing the name would fail, not the file.
    return {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[^\ud800-\udfff]*$",
            "description": f"{what} (1 to 200 characters of text)"}


# What `replay --save` writes (Grid.to_json); a file that breaks it would be replayed into a wrong verdict, so none is.
GRIDS_SCHEMA = {
    "type": "object",
    "required": ["format", "experiment", "jobs"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": GRIDS_FORMAT},
        "experiment": _name("an experiment's name"),
        "source": {"type": "string", "maxLength": 1000},
        "jobs": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/job"}},
    },
    "$defs": {
        "job": {
            "type": "object",
            "required": ["job", "variant", "groups", "settings"],
            "additionalProperties": False,
            "properties": {
                "job": _name("a job id"),
                "variant": _name("a variant's name"),
                "batch": {"type": ["integer", "null"], "minimum": 1},
                "groups": {"type": "array", "items": {"type": "array", "minItems": 1, "items": _name("a layer")}},
                "settings": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/setting"}},
            },
        },
        "setting": {
            "type": "object",
            "required": ["params", "layer_ms"],
            "additionalProperties": False,
            "properties": {
                "params": {"type": "object", "propertyNames": _name("a layer"),
                           "additionalProperties": {"type": "object", "propertyNames": _name("a tunable"),
                                                    "additionalProperties": {"type": ["number", "string", "boolean"]}}},
                # null: the setting failed, came out wrong or is suspect; else each conv layer's median op time.
                "layer_ms": {"type": ["object", "null"], "minProperties": 1, "propertyNames": _name("a layer"),
                             "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
            },
        },
    },
}


def load_grids(path: str | Path) -> tuple[str, list[Grid]]:
    """A grids file's experiment and grids, read within bounds and checked whole before any is replayed: its
    schema (GRIDS_SCHEMA), then what a schema cannot say (check_grid). Anything wrong is one ConfigError line
    naming the file and the key."""
    from convsweep.base.schema import validate
    from convsweep.base.strict_json import read_json

    try:
        data = read_json(path, MAX_GRIDS_BYTES)  # size, depth, UTF-8, finite numbers
    except StoreError as e:
        raise ConfigError(f"{path}: not a grids file: {str(e).removeprefix(f'{path}: ')}") from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != GRIDS_FORMAT:
        raise ConfigError(f"{path}: format: expected {GRIDS_FORMAT!r}, got {found!r}"[:300])
    validate(data, GRIDS_SCHEMA, str(path), fill_defaults=False)
    seen: dict[str, int] = {}
    for i, job in enumerate(data["jobs"]):
        if job["job"] in seen:  # replayed twice, it would count twice in every verdict
            raise ConfigError(f"{path}: jobs[{i}].job: {job['job']!r} is jobs[{seen[job['job']]}] again")
        seen[job["job"]] = i
        check_grid(job, str(path), f"jobs[{i}]")
    return data["experiment"], [Grid(job["job"], job["variant"], job.get("batch"),
                                     [s["params"] for s in job["settings"]],
                                     [s["layer_ms"] for s in job["settings"]], job["groups"])
                                for job in data["jobs"]]


def check_grid(job: dict[str, Any], source: str, where: str) -> None:
    """What a search over the job's grid takes for granted (a job of a file its schema has passed): every setting
    names the same layers and tunables, no setting twice (equal as the search compares values: 1, 1.0 and true
    alike), each measured one the op time of each of those layers, and the groups each layer once."""
    settings = job["settings"]
    shape = {layer: list(tunables) for layer, tunables in settings[0]["params"].items()}
    layers = set(shape)
    timed: set[str] | None = layers or None
    first: dict[tuple, int] = {}
    for j, setting in enumerate(settings):
        params = setting["params"]
        if {layer: sorted(t) for layer, t in params.items()} != {layer: sorted(t) for layer, t in shape.items()}:
            raise ConfigError(f"{source}: {where}.settings[{j}].params: expected the layers and tunables of "
                              f"settings[0] ({_shape(shape)}), got {_shape(params)}")
        key = tuple(params[layer][name] for layer, names in shape.items() for name in names)
        if key in first:
            raise ConfigError(f"{source}: {where}.settings[{j}].params: the setting of settings[{first[key]}] again")
        first[key] = j
        times = setting["layer_ms"]
        if times is not None:
            timed = timed or set(times)
            if set(times) != timed:
                raise ConfigError(f"{source}: {where}.settings[{j}].layer_ms: expected the op time of "
                                  f"{', '.join(sorted(timed))}, got {', '.join(sorted(times))}")
    grouped = [layer for group in job["groups"] for layer in group]
    if sorted(grouped) != sorted(layers):
        raise ConfigError(f"{source}: {where}.groups: expected each layer of the params ({', '.join(shape) or 'none'}) "
                          f"in one group, got {json.dumps(job['groups'])[:120]}")


def _shape(params: dict[str, Any]) -> str:
    shown = "; ".join(f"{layer}: {', '.join(tunables) or 'none'}" for layer, tunables in params.items()) or "no layer"
    return shown if len(shown) <= 120 else shown[:117] + "..."


@dataclass(frozen=True)
class Judged:
    """One strategy over every searchable grid and seed: the share of (grid, seed) searches that came within
    TOLERANCE of their grid's best, the median settings it took them, and the settings measured in all."""

    strategy: str
    searches: int
    reached: int
    median_to_reach: float | None  # settings, over the searches that reached it
    median_share_to_reach: float | None  # the same, as a share of the grid
    measured: int
    settings: int


def budget_for(budget: str | int, settings: int) -> int:
    """'20%' of a grid's settings (at least 1), or a number of settings (at most all of them)."""
    text = str(budget).strip()
    if text.endswith("%"):
        share = float(text[:-1]) / 100
        if not 0 < share <= 1:
            raise ConvsweepError(f"replay --budget: expected a share in (0%, 100%], got {budget}")
        return max(1, int(settings * share))
    if not text.isdigit() or int(text) < 1:
        raise ConvsweepError(f"replay --budget: expected N settings or P%, got {budget!r}")
    return min(int(text), settings)


def judge(grids: Sequence[Grid], strategy: str, budget: str | int = DEFAULT_BUDGET, seeds: int = DEFAULT_SEEDS,
          tolerance: float = TOLERANCE) -> Judged:
    """Replay `strategy` with `budget` over each grid (with at least MIN_OK ok settings), once per seed."""
    from convsweep.sweep.search import STRATEGIES, run

    if strategy not in STRATEGIES:
        raise ConvsweepError(f"replay --strategy: unknown {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    searchable = [g for g in grids if sum(t is not None for t in g.op_time_ms) >= MIN_OK]
    reached, shares, measured, settings, searches = [], [], 0, 0, 0
    for grid in searchable:
        n = budget_for(budget, len(grid.params))
        for seed in range(1 if strategy == "grid" else seeds):  # the grid's order has no seed
            search = {"strategy": "grid"} if strategy == "grid" else {"strategy": strategy, "budget": n, "seed": seed}
            outcome = run(grid.params, grid.layer_ms.__getitem__, search, tolerance, grid.best_ms, grid.groups)
            searches += 1
            measured += len(outcome.order)
            settings += len(grid.params)
            if outcome.reached_after is not None:
                reached.append(outcome.reached_after)
                shares.append(outcome.reached_after / len(grid.params))
    return Judged(strategy, searches, len(reached), statistics.median(reached) if reached else None,
                  statistics.median(shares) if shares else None, measured, settings)


JUDGED_COLUMNS = ["strategy", "searches", "within 2% of the best", "reached", "median settings to reach",
                  "median share of the grid to reach", "settings measured"]


def judged_row(j: Judged) -> list[Any]:
    return [j.strategy, j.searches, f"{j.reached / j.searches:.0%}" if j.searches else "-", j.reached,
            j.median_to_reach, f"{j.median_share_to_reach:.1%}" if j.median_share_to_reach is not None else None,
            f"{j.measured:,} of {j.settings:,} ({j.measured / j.settings:.0%})" if j.settings else "-"]
