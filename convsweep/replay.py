"""`convsweep replay`: search strategies judged offline, against grids measured whole. Each job of a stored grid
is a space whose every setting's time is known; a strategy searches it as a job would (convsweep.search), but
each setting it asks for is answered from the stored medians, so no GPU is needed and a strategy's luck can be
told from its skill over many seeds. It reports how often the strategy came within 2% of the grid's best, and
after how many settings.

The grids come from the database (the latest measurement of each setting of a grid-searched job) or from a
grids file that `replay --save` writes of them: small enough to commit, so that CI replays a real GPU's grid.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConvsweepError
from .fileio import write_json_atomic

GRIDS_FORMAT = "convsweep-grids-1"
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
            layer_ms.append({layer: float(v) for layer, v in t.items()} if ok else None)
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


def load_grids(path: str | Path) -> tuple[str, list[Grid]]:
    """A grids file's experiment and grids; one line naming the file and what it lacks."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != GRIDS_FORMAT:
            raise ConvsweepError(f"{path}: format: expected {GRIDS_FORMAT!r}, got {data.get('format')!r}")
        return data["experiment"], [Grid(job["job"], job["variant"], job.get("batch"),
                                         [s["params"] for s in job["settings"]],
                                         [s["layer_ms"] for s in job["settings"]], job["groups"])
                                    for job in data["jobs"]]
    except OSError as e:
        raise ConvsweepError(f"{path}: cannot read: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConvsweepError(f"{path}: not a grids file ({type(e).__name__}: {e})") from None


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
    from .search import STRATEGIES, run

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


def add_parser(sub, db_help: str) -> None:
    """`convsweep replay`, on the command line's subparsers."""
    p = sub.add_parser("replay", help="judge search strategies offline against stored whole grids (no GPU)",
                       description="Replays each strategy against every job of EXPERIMENT whose whole grid is "
                                   "stored, once per seed, answering each setting it asks for from the stored "
                                   "medians, and prints how often it came within 2%% of the grid's best and after "
                                   "how many settings.")
    p.add_argument("--experiment", help="the experiment whose grids to replay (default: the grids file's)")
    p.add_argument("--strategy", default="grid,random,tpe,genetic",
                   help="strategies to judge, comma-separated (default: %(default)s)")
    p.add_argument("--budget", default=DEFAULT_BUDGET,
                   help="settings each search may measure: N, or P%% of its grid (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="searches per grid (default: %(default)s)")
    p.add_argument("--db", help=db_help)
    p.add_argument("--grids", metavar="FILE", help="replay the grids of this file instead of the database's")
    p.add_argument("--save", metavar="FILE", help="write the database's grids of EXPERIMENT to FILE (to commit)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="a Markdown table, CSV or JSON rows (default: %(default)s)")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args) -> None:
    from .query import render
    from .search import STRATEGIES

    if args.grids:
        experiment, grids = load_grids(args.grids)
        if args.experiment and args.experiment != experiment:
            raise ConvsweepError(f"{args.grids}: holds experiment {experiment!r}, not {args.experiment!r}")
    elif args.experiment:
        experiment, grids = args.experiment, stored_grids(args.db, args.experiment)
    else:
        raise ConvsweepError("replay: give --experiment (the database's grids) or --grids FILE")
    strategies = [name.strip() for name in args.strategy.split(",")]
    for name in strategies:  # every mistake of the command line before any output
        if name not in STRATEGIES:
            raise ConvsweepError(f"replay --strategy: unknown {name!r}: expected one of {', '.join(STRATEGIES)}")
    budget_for(args.budget, 1)
    if args.seeds < 1:
        raise ConvsweepError(f"replay --seeds: expected 1 or more, got {args.seeds}")
    if args.save:
        save_grids(args.save, experiment, grids, args.grids or "the database")
        print(f"wrote {len(grids)} grids of {experiment} to {args.save}")
    settings = sum(len(g.params) for g in grids)
    print(f"{experiment}: {len(grids)} grids, {settings:,} settings; budget {args.budget} of each grid, "
          f"{args.seeds} seeds, within {TOLERANCE:.0%} of each grid's best")
    rows = [judged_row(judge(grids, name, args.budget, args.seeds)) for name in strategies]
    print(render(JUDGED_COLUMNS, rows, args.format))
