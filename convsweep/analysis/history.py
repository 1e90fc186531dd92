"""Every job's history across commits, and the steps in it: where its Op Time moved up or down and stayed.

A job is what `convsweep compare` calls one (its CELL and its tunable setting, convsweep.analysis.compare), so a sweep run
again at a later commit continues the same history. Its ok measurements, in the order they were taken, are the
points: each one's median Op Time (its conv layers' op times added up, pass by pass) with a bootstrap interval
over its samples. Suspect runs are kept beside them for the figure and never count; incorrect and failed runs have
no time. Steps are found in two moves: ruptures' Pelt proposes change points on the log-medians, with a penalty
scaled by the series' noise, and convsweep.base.stats' compare_samples confirms each on the pooled samples of the
segments either side and on the two measurements either side: only a SLOWER or FASTER verdict beyond the
threshold, the same on both, is a step. A level must hold for MIN_SEGMENT measurements on each side, so one
outlying measurement is no step (and a change at the newest commit alone is `convsweep compare`'s to judge until
the job is measured again).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from .compare import CELL, COMPARED, job_cell, stored_samples
from convsweep.sweep.config import tunables_text
from convsweep.base.errors import StoreError
from convsweep.base.fileio import json_column
from convsweep.base.numbers import median, middle
from .query import fetch_dicts
from convsweep.base.stats import FASTER, MIN_SAMPLES, SLOWER, Change, bootstrap_ratio, compare_samples

DEFAULT_THRESHOLD = 0.05  # compare's: a step smaller than 5% is not reported
MIN_SEGMENT = 2  # measurements a level must hold on each side of a step
# The least noise assumed of a series' log-medians (0.1%): identical medians would otherwise make every
# measurement a candidate (a zero penalty), all of them turned down by compare_samples at some cost.
NOISE_FLOOR = 1e-3
STEP_VERDICTS = (SLOWER, FASTER)
_Z95 = 1.96  # a 95% interval's half-width in standard deviations, to read a noise off the points' intervals


@dataclass(frozen=True)
class Point:
    """One measurement of a job: its run, commit (dirty: uncommitted changes), status (ok or suspect) and median
    Op Time with its 95% bootstrap interval (None with fewer than stats.MIN_SAMPLES samples)."""

    run_id: int
    commit: str | None
    dirty: bool | None
    started_at: Any
    status: str
    median_ms: float | None
    low_ms: float | None
    high_ms: float | None
    samples: tuple[float, ...] = field(repr=False, default=())
    gpu: str | None = None


@dataclass(frozen=True)
class Step:
    """Where a job's Op Time moved and stayed: `index` is the first ok point after the change (its run and commit),
    before and after the pooled medians of the segments either side, the ratio (after over before) its interval
    and compare_samples' verdict."""

    index: int
    run_id: int
    commit: str | None
    dirty: bool | None
    before_ms: float
    after_ms: float
    ratio: float
    low: float
    high: float
    verdict: str
    measurements_before: int
    measurements_after: int


@dataclass
class JobHistory:
    """One job's points in the order they were measured (ok and suspect), and the steps among its ok ones."""

    experiment: str
    job: str
    setting: str
    cell: dict[str, Any]
    points: list[Point]
    steps: list[Step] = field(default_factory=list)
    searched: bool = True  # False for a CPU-timed job: host times, not searched for steps (see compare)

    @property
    def ok(self) -> list[Point]:
        return [p for p in self.points if p.status == "ok" and p.median_ms]


def point_interval(samples: Sequence[float]) -> tuple[float | None, float | None]:
    """A median's 95% bootstrap interval (in its own unit): stats' ratio interval over a constant 1, so the same
    resampling (and seed) as compare's; (None, None) with fewer than MIN_SAMPLES samples, like compare_samples."""
    if len(samples) < MIN_SAMPLES:
        return None, None
    _, low, high = bootstrap_ratio([1.0], samples)
    return low, high


def find_steps(points: Sequence[Point], threshold: float = DEFAULT_THRESHOLD) -> list[Step]:
    """The confirmed steps of a series of ok points: Pelt's candidates on the log-medians, each kept only while
    compare_samples calls the pooled segments (and the measurements) either side SLOWER or FASTER; a turned-down
    candidate merges its two segments and the rest are judged again, until every one left is confirmed."""
    if len(points) < 2 * MIN_SEGMENT:
        return []
    breaks = _candidates([math.log(cast(float, p.median_ms)) for p in points], points)  # ok points have one
    while True:
        judged = [(b, _judge(points, lo, b, hi, threshold))
                  for lo, b, hi in zip([0, *breaks], breaks, [*breaks[1:], len(points)])]
        kept = [b for b, change in judged if change is not None]
        if kept == breaks:
            break
        breaks = kept
    steps = []
    for (b, change), lo, hi in zip(judged, [0, *breaks], [*breaks[1:], len(points)]):
        # Every break left is confirmed: a SLOWER or FASTER change, between two pools of samples.
        assert change is not None and change.ratio is not None and change.low is not None and change.high is not None
        first = points[b]
        steps.append(Step(b, first.run_id, first.commit, first.dirty, middle(_pooled(points[lo:b])),
                          middle(_pooled(points[b:hi])), change.ratio, change.low, change.high,
                          change.verdict, b - lo, hi - b))
    return steps


def _candidates(log_medians: list[float], points: Sequence[Point]) -> list[int]:
    """Pelt's change points (indices of the first point after each) under an l2 cost, penalised as ruptures' own
    examples do (log n x sigma squared), sigma the larger of the medians' point-to-point noise and their own
    intervals' width: a series no noisier than its samples is not cut at every wobble."""
    import numpy as np
    import ruptures

    series = np.asarray(log_medians)
    differences = np.diff(series)
    # Robust: a step is one large difference among many small ones, and MAD passes it over.
    between = float(np.median(np.abs(differences - np.median(differences)))) / 0.6745 / math.sqrt(2)
    widths = [math.log(p.high_ms / p.low_ms) / (2 * _Z95) for p in points if p.low_ms and p.high_ms]
    within = float(np.median(widths)) if widths else 0.0
    sigma = max(between, within, NOISE_FLOOR)
    algo = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(series.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=math.log(len(series)) * sigma ** 2)[:-1]]


def _pooled(points: Sequence[Point]) -> list[float]:
    return [value for p in points for value in p.samples]


def _judge(points: Sequence[Point], lo: int, b: int, hi: int, threshold: float) -> Change | None:
    """The pooled segments' change at break `b` when it is a step: SLOWER or FASTER, and the same verdict on the
    two measurements either side (a pool holding one outlying measurement has a median between its levels, which
    can pass for a step; the measurements either side of a real one differ as much). None when it is not."""
    change = compare_samples(_pooled(points[lo:b]), _pooled(points[b:hi]), threshold)
    if change.verdict not in STEP_VERDICTS:
        return None
    either_side = compare_samples(points[b - 1].samples, points[b].samples, threshold)
    return change if either_side.verdict == change.verdict else None


_RUN_SQL = f"""
    SELECT {", ".join(f"r.{c}" for c in CELL)}, r.id, r.job_id, r.params, r.git_commit, r.git_dirty, r.started_at,
           r.status, e.gpu
    FROM run r
    JOIN environment e ON e.id = r.environment_id
    WHERE r.status IN ({", ".join(f"'{s}'" for s in COMPARED)}){{experiment}}
    ORDER BY CASE WHEN r.started_at IS NULL THEN 1 ELSE 0 END, r.started_at, r.id"""


def histories(db: str | None, experiment: str | None = None, threshold: float = DEFAULT_THRESHOLD,
              cpu: bool = False) -> list[JobHistory]:
    """Every job's history (of one experiment, or all), with its steps; CPU-timed jobs are not searched for steps
    unless `cpu` (host times move between runs for reasons the samples cannot show)."""
    if threshold <= 0:
        raise StoreError(f"history: the threshold must be above 0, got {threshold}")
    _, runs = fetch_dicts(db, _RUN_SQL.format(experiment=" AND r.experiment = :experiment" if experiment else ""),
                          {"experiment": experiment} if experiment else None)
    op_times = stored_samples(db, [run["id"] for run in runs]).get("op_time", {}) if runs else {}
    by_job: dict[tuple, list[dict]] = {}
    for run in runs:
        run["variants"], run["params"] = json_column(run["variants"]), json_column(run["params"]) or {}
        by_job.setdefault((job_cell(run), json.dumps(run["params"], sort_keys=True)), []).append(run)
    found = []
    for measured in by_job.values():
        newest = measured[-1]
        points = [_point(run, op_times.get(run["id"], [])) for run in measured]
        history = JobHistory(newest["experiment"], newest["job_id"], tunables_text(newest["params"]),
                             {c: newest[c] for c in CELL if c != "variants"}, points,
                             searched=cpu or newest["profiler"] != "cpu")
        if history.searched:
            history.steps = find_steps(history.ok, threshold)
        found.append(history)
    return sorted(found, key=lambda h: (h.experiment, h.job, h.setting))


def _point(run: dict[str, Any], samples: list[float]) -> Point:
    values = tuple(v for v in samples if v is not None and v > 0)
    low, high = point_interval(values)
    centre = median(values) if values else None
    return Point(run["id"], run["git_commit"], None if run["git_dirty"] is None else bool(run["git_dirty"]),
                 run["started_at"], run["status"], centre, low, high, values, run["gpu"])


REGRESSION_COLUMNS = ["experiment", "job", "setting", "commit", "tree", "before (ms)", "after (ms)", "ratio",
                      "ratio low", "ratio high", "verdict", "measurements before/after", "run"]


def regressions(db: str | None, params: dict[str, str] | None = None) -> tuple[list[str], list[list[Any]]]:
    """`convsweep query regressions`: one row per step of every job, in experiment, job and commit order.
    --param experiment=NAME keeps one experiment, --param threshold=0.1 sets the threshold (default 5%)."""
    params = dict(params or {})
    unknown = sorted(set(params) - {"experiment", "threshold"})
    if unknown:
        raise StoreError(f"regressions: unknown --param {unknown[0]}: expected experiment or threshold")
    try:
        threshold = float(params.get("threshold", DEFAULT_THRESHOLD))
    except ValueError:
        raise StoreError(f"regressions: --param threshold={params['threshold']}: expected a number, "
                         "e.g. 0.05") from None
    rows = [[h.experiment, h.job, h.setting, (s.commit or "")[:10], _tree(s.dirty), s.before_ms, s.after_ms,
             s.ratio, s.low, s.high, s.verdict, f"{s.measurements_before}/{s.measurements_after}", s.run_id]
            for h in histories(db, params.get("experiment"), threshold) for s in h.steps]
    return REGRESSION_COLUMNS, rows


def _tree(dirty: bool | None) -> str:
    return "" if dirty is None else "dirty" if dirty else "clean"
