"""`convsweep leaderboard`: a course's submissions ranked per GPU model and cell, in statistical tiers, with points.

A submission is one student's variants, named `<submission>__<variant>` (submission_of). A board is one experiment
on one GPU model at one cell (the batch and the sweep's other axes): there each submission stands by its best
trusted run, the lowest median op-time sum (per timed pass, the conv layers added up) among its settings' latest
measurements that are ok with every check passed (`checks: full`). A run measured with `checks: fast` (no caching
test) ranks only with `fast_checks`, marked. Submissions the stored samples cannot tell apart share a tier and a
rank (`tiers`; docs/leaderboard.md has the rule and why). Every other latest run of the board (failed, incorrect,
suspect, timed out, not fresh, fast-checked) is listed below the ranked ones with its reason and what its builds'
compiled code does that a convolution needs not (run.findings). Points come from a thresholds file
(workflow/schemas/leaderboard.schema.yaml). CPU-timed runs (the `reference` variant) are left out.
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from convsweep.base import axes
from convsweep.base.document import Heading, Paragraph, Table, to_html, to_markdown
from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import json_column, write_atomic
from convsweep.base.numbers import fixed, median, rounded, short, signed_percent
from convsweep.base.schema import validate
from convsweep.base.stats import MIN_SAMPLES, bootstrap_ratio, relative_spread
from convsweep.base.yamlio import read_yaml_file
from convsweep.store.views import TRUSTED, verdict_sql
from .query import fetch_dicts

SEPARATOR = "__"  # <submission>__<variant>
DEFAULT_THRESHOLD = 0.05  # a new tier takes an interval wholly above 1 + this; compare's "change that counts"
REASON_CHARS = 100  # a reason is cut here in the terminal's table; CSV, JSON and HTML have it whole
# Why a run is not ranked, by its verdict (latest_run.verdict, convsweep/store/views.py) where its error does not say.
NOT_RANKED_WHY = {
    "fast-checks": "measured with `checks: fast` (no caching test vouches for it): measure it again with "
                   "`checks: full`, or rank it with --fast-checks",
    "unchecked": "no integrity checks ran (stored before them)",
    "not-fresh": "some timed passes ran on inputs its kernel had seen (stored before every pass was fresh)",
    "untimed": "no op time stored",
}
# Which of a submission's runs stands for it in the CSV when none ranks: the nearest to ranking, then the fastest.
NOT_RANKED_ORDER = ("fast-checks", "unchecked", "not-fresh", "untimed", "suspect", "incorrect", "timeout", "failed")
CSV_COLUMNS = ("experiment", "gpu", "batch", "cell", "submission", "rank", "tier", "op_time_1_ms", "op_time_2_ms",
               "op_time_sum_ms", "forward_ms", "accuracy", "points", "status", "reason", "variant", "run_id", "samples",
               "vs_tier_leader_pct", "detectable_pct", "checks", "findings", "confirmed", "confirmation")


def submission_of(variant: str) -> str:
    """The submission a variant belongs to: what comes before `__` (`s042__tiled` -> `s042`), else the name itself."""
    submission, separator, _ = variant.partition(SEPARATOR)
    return submission if separator and submission else variant


def run_submission(variants: dict[str, str] | None, variant: str) -> str:
    """A run's submission: its layers' variants' one submission, or, where they mix submissions, theirs joined by +."""
    found = sorted({submission_of(name) for name in (variants or {}).values()}) or [submission_of(variant)]
    return "+".join(found)


# -- points ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PointRule:
    """`points` for an op-time sum (the median shown) of at most `op_time_sum_ms_at_most`, at `batch` and on `gpu`
    (environment.gpu's name) where given; a submission gets the most of the rules it meets."""

    op_time_sum_ms_at_most: float
    points: float
    batch: int | None = None
    gpu: str | None = None

    def meets(self, gpu: str, batch: int, op_time_sum_ms: float | None) -> bool:
        return (op_time_sum_ms is not None and op_time_sum_ms <= self.op_time_sum_ms_at_most
                and self.batch in (None, batch) and self.gpu in (None, gpu))


def load_points(path: str | Path) -> list[PointRule]:
    """A thresholds file, checked against workflow/schemas/leaderboard.schema.yaml: a bad one is one ConfigError line
    naming the file, the line and the key."""
    path = Path(path)
    document = validate(read_yaml_file(path), "leaderboard", str(path), yaml_file=path, max_nodes=10_000)
    return [PointRule(**rule) for rule in document["points"]]


def points_for(rules: Sequence[PointRule] | None, gpu: str, batch: int, op_time_sum_ms: float | None
               ) -> float | None:
    """The most points of the rules met (0 where none is); None without rules."""
    if rules is None:
        return None
    return max((rule.points for rule in rules if rule.meets(gpu, batch, op_time_sum_ms)), default=0)


# -- the boards --------------------------------------------------------------------------------------------------

@dataclass
class Entry:
    """One run on a board: a submission's best trusted run (ranked), or a run that is not ranked and why (`reason`).
    ratio, low, high: its median op-time sum over that of `against` (its tier's leader; a tier's leader's is
    against the leader of the tier before), with a bootstrap interval; `detectable`: that interval's half-width,
    the smallest difference these samples could tell (a fraction)."""

    submission: str
    run_id: int
    variant: str
    params: dict[str, Any] | None
    status: str  # the run's verdict; `unchecked` for an ok run without integrity checks
    checks: str | None
    op_time_1_ms: float | None
    op_time_2_ms: float | None
    op_time_sum_ms: float | None  # the median of the per-pass sums; without samples, the layers' medians added up
    forward_ms: float | None
    accuracy: float | None
    findings: str = ""
    reason: str = ""
    samples: int = 0
    spread: float | None = None  # of the per-pass sums: median absolute deviation over the median
    rank: int | None = None
    tier: int | None = None
    against: str | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    detectable: float | None = None
    points: float | None = None
    confirmed: bool | None = None  # a tier's top measured again (`--confirm`, convsweep.analysis.tiers): did it hold
    confirmation: str = ""  # what the re-measurement said of it


@dataclass
class Board:
    """One experiment on one GPU model at one cell: the ranked entries in order of median (those with too few samples
    to tier, at their place, unranked), and every other latest run of the cell, not ranked."""

    experiment: str
    gpu: str
    cell: dict[str, Any]
    ranked: list[Entry] = field(default_factory=list)
    not_ranked: list[Entry] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.experiment} · {self.gpu} · {axes.cell_text(self.cell)}"

    @property
    def tiers(self) -> int:
        return max((entry.tier or 0 for entry in self.ranked), default=0)

    def standing(self) -> list[Entry]:
        """One entry per submission, the CSV's rows: each ranked one, then for each submission without one the run
        nearest to ranking (NOT_RANKED_ORDER), then its fastest."""
        shown = {entry.submission for entry in self.ranked}
        rest: dict[str, Entry] = {}
        for entry in sorted(self.not_ranked, key=_nearest_to_ranking):
            rest.setdefault(entry.submission, entry)
        return [*self.ranked, *(rest[name] for name in sorted(rest) if name not in shown)]


def _nearest_to_ranking(entry: Entry) -> tuple:
    order = NOT_RANKED_ORDER.index(entry.status) if entry.status in NOT_RANKED_ORDER else len(NOT_RANKED_ORDER)
    return order, entry.op_time_sum_ms is None, entry.op_time_sum_ms or 0.0, entry.run_id


def _newest_sql(experiment: str | None) -> str:
    """WITH newest: each setting's newest measurement on each GPU model, with its verdict. Not latest_run, which keeps
    one measurement per setting whatever the GPU: a course measuring one spec on two GPU models would lose one."""
    return f"""
WITH measured AS (
    SELECT r.*, e.gpu,
           ROW_NUMBER() OVER (PARTITION BY r.run_key, e.gpu
                              ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
    FROM run r
    JOIN environment e ON e.id = r.environment_id
    WHERE (r.profiler IS NULL OR r.profiler <> 'cpu'){" AND r.experiment = :experiment" if experiment else ""}
),
newest AS (
    SELECT m.*, {verdict_sql("m")} AS verdict
    FROM measured m
    WHERE m.measurement_rank = 1
)"""


def _runs_sql(experiment: str | None) -> str:
    return f"""{_newest_sql(experiment)}
SELECT n.id AS run_id, n.experiment, n.variant, n.variants, n.params, {axes.columns("n")}, n.verdict, n.checks,
       n.error, n.findings, o.op_time_1_ms, o.op_time_2_ms, n.forward_ms, n.accuracy, n.gpu,
       conv.op_time_ms AS op_time_sum_ms
FROM newest n
JOIN run_op_time o ON o.run_id = n.id
LEFT JOIN (SELECT run_id, SUM(op_time_ms) AS op_time_ms FROM layer_time GROUP BY run_id) conv ON conv.run_id = n.id
ORDER BY n.id"""


def _samples_sql(experiment: str | None) -> str:
    """Each trusted newest run's per-pass op-time sums: every conv layer's sample of a pass added up."""
    trusted = ", ".join(f"'{name}'" for name in TRUSTED)
    return f"""{_newest_sql(experiment)}
SELECT s.run_id, s.repeat, SUM(s.value) AS op_time_ms, COUNT(*) AS layers
FROM sample s
JOIN newest n ON n.id = s.run_id
WHERE s.metric = 'op_time_ms' AND n.verdict IN ({trusted})
GROUP BY s.run_id, s.repeat
ORDER BY s.run_id, s.repeat"""


def stored_sums(db: str | None, experiment: str | None) -> dict[int, list[float]]:
    """run id -> its timed passes' op-time sums, a pass counted where it has every conv layer's sample."""
    params = {"experiment": experiment} if experiment else {}
    _, rows = fetch_dicts(db, _samples_sql(experiment), params)
    passes: dict[int, list[tuple[int, float]]] = {}
    for row in rows:
        passes.setdefault(row["run_id"], []).append((int(row["layers"]), float(row["op_time_ms"])))
    return {run_id: [value for layers, value in found if layers == max(n for n, _ in found)]
            for run_id, found in passes.items()}


def leaderboard(db: str | None, experiment: str | None = None, threshold: float = DEFAULT_THRESHOLD,
                fast_checks: bool = False, points: Sequence[PointRule] | None = None) -> list[Board]:
    """The boards of `experiment` (every experiment's where None, each on boards of its own), by experiment, GPU and
    cell; an error where none has a run stored."""
    if not threshold >= 0:
        raise ConvsweepError(f"leaderboard: --threshold must be 0 or more, got {threshold}")
    _, runs = fetch_dicts(db, _runs_sql(experiment), {"experiment": experiment} if experiment else {})
    if not runs:
        where = f"experiment {experiment!r}" if experiment else "the database"
        raise ConvsweepError(f"leaderboard: no GPU run of {where} is stored: run a sweep first")
    sums = stored_sums(db, experiment)
    ranks = TRUSTED if fast_checks else ("ok",)  # the verdicts that rank
    boards: dict[tuple, Board] = {}
    candidates: dict[tuple, dict[str, list[Entry]]] = {}
    for run in runs:
        cell = {name: run[name] for name in axes.NAMES}
        gpu = run["gpu"] or "(no GPU named)"
        key = (run["experiment"], gpu, axes.sort_key(cell))
        board = boards.setdefault(key, Board(run["experiment"], gpu, cell))
        entry = _entry(run, sums.get(run["run_id"], []))
        if entry.status in ranks and entry.op_time_sum_ms is not None:
            candidates.setdefault(key, {}).setdefault(entry.submission, []).append(entry)
        else:
            entry.reason = run["error"] or NOT_RANKED_WHY.get(entry.status, "no reason stored")
            board.not_ranked.append(entry)
    for key, board in boards.items():
        best = [min(entries, key=lambda e: (e.samples < MIN_SAMPLES, e.op_time_sum_ms, e.run_id))
                for entries in candidates.get(key, {}).values()]
        board.ranked = tiers(best, sums, threshold)
        board.not_ranked.sort(key=lambda e: (e.submission, e.variant, e.run_id))
        for entry in board.ranked:
            entry.points = points_for(points, board.gpu, board.cell["batch"], entry.op_time_sum_ms)
        for entry in board.not_ranked:  # no points for a time that is not trusted
            entry.points = points_for(points, board.gpu, board.cell["batch"], None)
    return [boards[key] for key in sorted(boards)]


def _entry(run: dict[str, Any], sums: list[float]) -> Entry:
    verdict = run["verdict"]
    if verdict == "ok" and run["checks"] is None:
        verdict = "unchecked"
    elif verdict in ("ok", "fast-checks") and run["op_time_sum_ms"] is None:
        verdict = "untimed"
    median_ms = median(sums)
    return Entry(run_submission(json_column(run["variants"]), run["variant"]), run["run_id"], run["variant"],
                 json_column(run["params"]), verdict, run["checks"], run["op_time_1_ms"], run["op_time_2_ms"],
                 median_ms if median_ms is not None else run["op_time_sum_ms"], run["forward_ms"], run["accuracy"],
                 findings=run["findings"] or "", samples=len(sums), spread=relative_spread(sums) if sums else None)


def tiers(entries: Iterable[Entry], samples: dict[int, list[float]], threshold: float = DEFAULT_THRESHOLD
          ) -> list[Entry]:
    """The entries in order of median op-time sum (ties: the less noisy first, then by name), each given its tier and
    rank. The fastest with at least MIN_SAMPLES samples leads tier 1; each next one is held to its tier's leader: the
    bootstrap interval of its median over the leader's lying wholly above 1 + threshold starts a new tier, which it
    leads; otherwise it shares the leader's tier and rank (competition ranking: 1, 1, 3). An entry with fewer samples
    cannot be told from anyone: it keeps its place, without tier or rank, and says so."""
    ordered = sorted(entries, key=lambda e: (e.op_time_sum_ms, e.spread or 0.0, e.submission, e.run_id))
    leader: Entry | None = None
    tiered = 0
    for entry in ordered:
        own = samples.get(entry.run_id, [])
        if len(own) < MIN_SAMPLES:
            entry.reason = (f"{len(own)} sample{'s' * (len(own) != 1)}: too few to tell apart from any other "
                            f"(at least {MIN_SAMPLES} to be tiered)")
            continue
        if leader is None:  # the board's leader: against no one; what it could tell is its own noise's interval
            _, low, high = bootstrap_ratio(own, own)
            entry.tier, entry.rank, entry.detectable = 1, 1, (high - low) / 2
            leader = entry
        else:
            entry.ratio, entry.low, entry.high = bootstrap_ratio(samples[leader.run_id], own)
            entry.against, entry.detectable = leader.submission, (entry.high - entry.low) / 2
            if entry.low > 1 + threshold:  # told apart: a new tier, which it leads
                entry.tier, entry.rank = (leader.tier or 0) + 1, tiered + 1
                leader = entry
            else:
                entry.tier, entry.rank = leader.tier, leader.rank
        if entry.detectable > threshold:
            entry.reason = (f"noisy: its samples tell no difference under ±{100 * entry.detectable:.1f}% "
                            f"from {entry.against or 'itself'}")
        tiered += 1
    return ordered


# -- written -----------------------------------------------------------------------------------------------------

def _vs(entry: Entry) -> str:
    if entry.against is None or entry.ratio is None:
        return ""
    return f"{signed_percent(entry.ratio)} [{signed_percent(entry.low)}, {signed_percent(entry.high)}] vs {entry.against}"


def _ms(value: float | None) -> str:
    return "" if value is None else short(float(value))


def _points(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _cut(text: str, cut: bool) -> str:
    text = " ".join(text.split())
    return text[:REASON_CHARS - 1] + "…" if cut and len(text) > REASON_CHARS else text


def blocks(boards: Sequence[Board], threshold: float, cut: bool = False) -> list:
    """The boards as document blocks (convsweep.base.document): per board its heading, the ranked table and the table
    of runs not ranked. `cut`: reasons cut to REASON_CHARS (the terminal)."""
    with_points = any(entry.points is not None for board in boards for entry in board.ranked)
    found: list = [Paragraph(f"Ranked by the median op-time sum (conv layers added up per timed pass); a tier holds "
                             f"those whose 95% bootstrap interval against its leader does not lie wholly above "
                             f"+{100 * threshold:g}%; ± detectable: the half-width of that interval "
                             "(docs/leaderboard.md).")]
    for board in boards:
        summary = (f"{len(board.ranked)} ranked in {board.tiers} tier{'s' * (board.tiers != 1)}, "
                   f"{len(board.not_ranked)} not ranked")
        found += [Heading(2, board.title), Paragraph(summary)]
        if board.ranked:
            headers = ["rank", "tier", "submission", "variant", "conv1 (ms)", "conv2 (ms)", "op time sum (ms)",
                       "vs tier leader", "± detectable", "forward (ms)", "accuracy", "samples",
                       *(["points"] if with_points else []), "note"]
            rows = [[str(e.rank or ""), str(e.tier or ""), e.submission, e.variant, _ms(e.op_time_1_ms),
                     _ms(e.op_time_2_ms), _ms(e.op_time_sum_ms), _vs(e),
                     "" if e.detectable is None else f"±{100 * e.detectable:.1f}%", _ms(e.forward_ms),
                     fixed(e.accuracy, 4), str(e.samples), *([_points(e.points)] if with_points else []),
                     _cut("; ".join(part for part in (e.confirmation, e.reason,
                                                      "fast checks" if e.checks == "fast" else "", e.findings)
                                     if part), cut)]
                    for e in board.ranked]
            numeric = [True, True, False, False, True, True, True, False, True, True, True, True,
                       *([True] if with_points else []), False]
            found.append(Table(headers, rows, numeric))
        if board.not_ranked:
            found += [Heading(3, "Not ranked"),
                      Table(["submission", "variant", "status", "run", "reason", "findings"],
                            [[e.submission, e.variant, e.status, str(e.run_id), _cut(e.reason, cut), _cut(e.findings, cut)]
                             for e in board.not_ranked], [False, False, False, True, False, False])]
    return found


def csv_rows(boards: Sequence[Board]) -> list[dict[str, Any]]:
    """One row per submission and board (a batch on a GPU), CSV_COLUMNS: what a course uploads. A submission that does
    not rank has its status, reason and accuracy, and no time: an untrusted time copied into a grade book reads as
    any other."""
    rows = []
    for board in boards:
        ranked = {entry.run_id for entry in board.ranked}
        for e in board.standing():
            timed = e.run_id in ranked
            times = {column: rounded(getattr(e, column), 4) if timed else None
                     for column in ("op_time_1_ms", "op_time_2_ms", "op_time_sum_ms", "forward_ms")}
            rows.append({"experiment": board.experiment, "gpu": board.gpu, "batch": board.cell["batch"],
                         "cell": axes.cell_text(board.cell), "submission": e.submission, "rank": e.rank,
                         "tier": e.tier, **times, "accuracy": e.accuracy, "points": e.points, "status": e.status,
                         "reason": " ".join(e.reason.split()), "variant": e.variant, "run_id": e.run_id,
                         "samples": e.samples,
                         "vs_tier_leader_pct": None if e.ratio is None else round(100 * (e.ratio - 1), 2),
                         "detectable_pct": None if e.detectable is None else round(100 * e.detectable, 2),
                         "checks": e.checks, "findings": e.findings,
                         "confirmed": None if e.confirmed is None else ("yes" if e.confirmed else "no"),
                         "confirmation": e.confirmation})
    return rows


def render(boards: Sequence[Board], fmt: str = "table", threshold: float = DEFAULT_THRESHOLD) -> str:
    """The boards as Markdown tables for a terminal, CSV (csv_rows) or JSON."""
    if fmt == "table":
        return to_markdown(blocks(boards, threshold, cut=True), Path("."))
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(csv_rows(boards))
        return out.getvalue()
    if fmt == "json":
        return json.dumps([{"experiment": b.experiment, "gpu": b.gpu, "cell": b.cell,
                            "ranked": [asdict(e) for e in b.ranked], "not_ranked": [asdict(e) for e in b.not_ranked]}
                           for b in boards], indent=1)
    raise ConvsweepError(f"leaderboard: unknown --format {fmt!r}: expected table, csv or json")


def write_html(path: str | Path, boards: Sequence[Board], threshold: float = DEFAULT_THRESHOLD,
               experiment: str | None = None) -> None:
    """One standalone page, written whole (write_atomic)."""
    title = f"Leaderboard: {experiment or 'every experiment'}"
    write_atomic(path, to_html([Heading(1, title), *blocks(boards, threshold)], title))
