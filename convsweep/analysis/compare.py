"""`convsweep compare A B`: is B faster, slower or the same as A, job by job, and how sure is that.

A and B each select stored runs: `sweep:N`, `commit:SHA`, `experiment:NAME`, `results:DIR` (the
results directory a sweep wrote, for two runs of one sweep from one clone), `runs:LO-HI` (run
ids), or the bare value (digits: a sweep id; 7-40 hex digits: a commit; an existing directory;
else an experiment). In each selection the newest ok or suspect run of every job stands for it; a
pair with a suspect run (its times the integrity checks doubt) gets the verdict SUSPECT and its
reason, never FASTER or SLOWER, and a run measured with fast checks is noted. Jobs match
by their cell (CELL: the experiment, variant and axes, as report tells cells apart, and what a time
depends on besides); within a cell that holds several tunable settings on either side, by the
setting too, so a sweep run again with another tunable compares as the same job. The statistics are
convsweep.base.stats: the ratio of medians over the stored samples, its bootstrap interval, a verdict
against a threshold. B's runs
may come from a database of their own (another machine's or session's file); A's come from `db`.

Jobs timed on the CPU (the `reference` variant, numpy float32) are left out unless asked for: their times are the
host's, and on a shared host they move by tens of percent between two runs of one sweep (the lent
H100's: -21.5% and +21.8% at batch 1000) while the samples within a run agree, so the interval
over the samples cannot see it and a verdict would blame the code.
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from convsweep.base.axes import BY_NAME, CELL_COLUMNS, shown
from convsweep.sweep.config import tunables_text
from convsweep.base.errors import ConvsweepError, StoreError
from convsweep.base.fileio import json_column
from .query import fetch_dicts
from convsweep.base.numbers import signed_percent
from convsweep.base.stats import SLOWER, UNSURE, compare_samples
from convsweep.store import resolve_url, show_url

# What two jobs must share to be one job: the cell as report tells cells apart (experiment, variant, a value of
# each axis), and what the cell leaves implicit but a time depends on: the profiler (events and nsys time a layer
# differently), the network and dataset (two may share an experiment name across databases), and the variant of
# each layer (a mixed label stands for several).
CELL = (*CELL_COLUMNS, "profiler", "network", "dataset", "variants")
_RUN_COLUMNS = ", ".join(("id", *CELL, "params", "git_commit", "status", "error", "checks"))
SUSPECT = "SUSPECT"  # a verdict beside convsweep.base.stats': either side's time cannot be trusted
COMPARED = ("ok", "suspect")  # the statuses whose runs may stand for a job
REASON_CHARS = 80  # a suspect run's reasons are cut here in the table; --format json has them whole
_KINDS = ("sweep", "commit", "experiment", "results", "runs", "rev")
_SELECTION_FORMS = ("latest, previous, sweep:N, commit:SHA, rev:REVISION (HEAD~1, a branch), experiment:NAME, "
                    "results:DIR or runs:LO-HI (or the bare value)")
# Per-job selections: of each job's ok or suspect measurements in id order, the newest, or the one before it.
PER_JOB = {"latest": -1, "previous": -2}
DEFAULT = ("previous", "latest")  # `convsweep compare` alone: each job's newest measurement against the one before
METRICS = ("op_time", "forward_ms")  # and each conv layer's name


@dataclass(frozen=True)
class Selection:
    """Which runs one side of a comparison holds, as a SQL condition on `run`."""

    kind: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Selection:
        kind, sep, value = text.partition(":")
        if not text.strip() or (sep and kind in _KINDS and not value.strip()):  # `commit:` would select every run
            raise ConvsweepError(f"empty selection{f' {text!r}' if text.strip() else ''}: expected {_SELECTION_FORMS}")
        if text in PER_JOB:
            return cls(text, "")
        if sep and kind == "rev" or re.fullmatch(r"(HEAD|@)([~^][0-9]*)*", text):
            return cls("commit", _git_commit(value if sep else text))
        if sep and kind in _KINDS:
            return cls(kind, value)
        if text.isdigit():
            return cls("sweep", text)
        if re.fullmatch(r"[0-9a-f]{7,40}", text):
            return cls("commit", text)
        if Path(text).is_dir():
            return cls("results", text)
        return cls("experiment", text)

    def condition(self, name: str) -> tuple[str, dict[str, Any]]:
        if self.kind in PER_JOB:  # every run: _newest_runs picks per job
            return "1 = 1", {}
        if self.kind == "sweep":
            return f"sweep_id = :{name}", {name: _integer(self.value, "a sweep id")}
        if self.kind == "commit":
            return f"git_commit LIKE :{name}", {name: f"{self.value}%"}
        if self.kind == "experiment":
            return f"experiment = :{name}", {name: self.value}
        if self.kind == "results":  # ingest keeps the path it was given: relative or absolute
            given, absolute = self.value.rstrip("/"), str(Path(self.value).resolve())
            return (f"(result_path LIKE :{name}_given OR result_path LIKE :{name}_abs)",
                    {f"{name}_given": f"{given}/%", f"{name}_abs": f"{absolute}/%"})
        lo, _, hi = self.value.partition("-")
        return (f"id BETWEEN :{name}_lo AND :{name}_hi",
                {f"{name}_lo": _integer(lo, "a run id"), f"{name}_hi": _integer(hi or lo, "a run id")})

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}" if self.value else self.kind


def _git_commit(revision: str) -> str:
    """The commit a git revision names in the repository here (HEAD~1, a branch, a tag), in full."""
    proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConvsweepError(f"{revision!r} names no commit of a git repository here")
    return proc.stdout.strip()


def _integer(text: str, what: str) -> int:
    if not text.isdigit():
        raise ConvsweepError(f"compare: expected {what}, got {text!r}")
    return int(text)


def _newest_runs(db: str | None, selection: Selection) -> list[dict]:
    """The run standing for each job of the selection: its newest ok or suspect one (for `previous`, the one
    before). A suspect run stands for its job rather than being passed over, so a job whose newer measurement
    cannot be trusted is shown as such, not compared on an older time without a word."""
    condition, params = selection.condition("sel")
    statuses = ", ".join(f"'{status}'" for status in COMPARED)
    _, runs = fetch_dicts(db, f"SELECT {_RUN_COLUMNS} FROM run WHERE status IN ({statuses}) AND {condition} "
                              "ORDER BY id", params)
    by_job: dict[tuple, list[dict]] = {}
    for run in runs:
        run["variants"], run["params"] = json_column(run["variants"]), json_column(run["params"]) or {}
        by_job.setdefault((job_cell(run), json.dumps(run["params"], sort_keys=True)), []).append(run)
    pick = PER_JOB.get(selection.kind, -1)  # the newest, or for `previous` the one before it
    return [measured[pick] for measured in by_job.values() if len(measured) >= -pick]


def job_cell(run: dict) -> tuple:
    """A job's identity across runs: its values of CELL."""
    return tuple(json.dumps(run[column], sort_keys=True) if column == "variants" else run[column] for column in CELL)


def stored_samples(db: str | None, run_ids: list[int]) -> dict[str, dict[int, list[float]]]:
    """metric -> run id -> one value per timed pass, for every metric the runs have: op_time (the conv layers' op
    times added up: the job's "Op Time"), forward_ms (the whole pass), and each conv layer's name (its op time)."""
    if not run_ids:
        return {}
    params = {f"r{i}": run_id for i, run_id in enumerate(run_ids)}
    ids = ", ".join(f":r{i}" for i in range(len(run_ids)))
    _, rows = fetch_dicts(db, "SELECT run_id, metric, layer, repeat, value FROM sample "
                              "WHERE (metric = 'op_time_ms' OR (metric = 'forward_ms' AND layer IS NULL)) "
                              f"AND run_id IN ({ids}) ORDER BY run_id, repeat", params)
    per_pass: dict[str, dict[int, dict[int, float]]] = {}
    for row in rows:
        run_id, repeat, value = row["run_id"], row["repeat"], float(row["value"])
        if row["metric"] == "forward_ms":
            per_pass.setdefault("forward_ms", {}).setdefault(run_id, {})[repeat] = value
            continue
        per_pass.setdefault(row["layer"], {}).setdefault(run_id, {})[repeat] = value
        op_time = per_pass.setdefault("op_time", {}).setdefault(run_id, {})
        op_time[repeat] = op_time.get(repeat, 0.0) + value
    return {metric: {run_id: list(passes.values()) for run_id, passes in runs.items()}
            for metric, runs in per_pass.items()}


def _side(db: str | None, selection: Selection, where: str) -> tuple[list[dict], dict[str, dict[int, list[float]]]]:
    """One side's newest ok or suspect runs and their samples by metric, both read from `db`."""
    runs = _newest_runs(db, selection)
    if not runs and selection.kind == "previous" and (jobs := len(_newest_runs(db, Selection("latest", "")))):
        # The usual first `convsweep compare`: one sweep run, so each job has its newest measurement and none before
        raise ConvsweepError(f"compare: every job in {where} has one measurement only ({jobs} job{'s' * (jobs != 1)}"
                             "): nothing before the newest to compare with: run the sweep again after an edit, or "
                             "compare two selections (`convsweep compare A B`)")
    if not runs:
        raise ConvsweepError(f"compare: {selection} selects no ok or suspect run in {where}")
    return runs, stored_samples(db, [run["id"] for run in runs])


def _selection(text: str, side: str) -> Selection:
    try:
        return Selection.parse(text)
    except ConvsweepError as e:
        raise ConvsweepError(f"compare: {side}: {e}") from None


def _check_metric(metric: str, *samples: dict[str, dict[int, list[float]]]) -> None:
    """A metric the runs were measured with: op_time, forward_ms, or a conv layer either side has."""
    layers = sorted({name for by_metric in samples for name in by_metric} - set(METRICS))
    if metric not in METRICS and metric not in layers:
        choices = ", ".join(METRICS + tuple(layers))
        raise ConvsweepError(f"compare: unknown --metric {metric!r}: expected one of {choices}")


def _pairs(runs_a: list[dict], runs_b: list[dict]) -> tuple[list[tuple[dict, dict]], int, int]:
    """Matched (A run, B run) pairs, and how many jobs only A or only B holds."""
    def by_cell(runs):
        cells: dict[tuple, dict[str, dict]] = {}
        for run in runs:
            cells.setdefault(job_cell(run), {})[json.dumps(run["params"], sort_keys=True)] = run
        return cells

    cells_a, cells_b = by_cell(runs_a), by_cell(runs_b)
    pairs, only_a, only_b = [], 0, 0
    for cell in sorted(cells_a.keys() | cells_b.keys(), key=str):
        a, b = cells_a.get(cell, {}), cells_b.get(cell, {})
        if len(a) == 1 and len(b) == 1:  # one setting each side: the same job, whatever its tunables
            pairs.append((next(iter(a.values())), next(iter(b.values()))))
            continue
        pairs += [(a[p], b[p]) for p in sorted(a.keys() & b.keys())]
        only_a += len(a.keys() - b.keys())
        only_b += len(b.keys() - a.keys())
    return pairs, only_a, only_b


def compare(db: str | None, a: str, b: str, metric: str = "op_time", threshold: float = 0.05,
            db_b: str | None = None, cpu: bool = False) -> dict:
    """The comparison of selections `a` and `b` as data: one row per matched job, and totals; an error when no job is
    compared. B is read from `db_b` when given, else from `db` like A; `cpu` keeps the CPU-timed jobs."""
    if threshold <= 0:
        raise ConvsweepError(f"compare: --threshold must be above 0, got {threshold}")
    sel_a, sel_b = _selection(a, "A"), _selection(b, "B")
    runs_a, samples_a = _side(db, sel_a, "the database")
    if db_b is None:
        runs_b, samples_b = _side(db, sel_b, "the database")
    else:
        try:
            runs_b, samples_b = _side(db_b, sel_b, "B's database")
        except StoreError as e:  # the same line A's side gives, said to be B's
            raise StoreError(f"compare: B's database: {e}") from e
    _check_metric(metric, samples_a, samples_b)
    pairs, only_a, only_b = _pairs(runs_a, runs_b)
    if not pairs:  # a CI gate must not pass on nothing
        raise ConvsweepError(f"compare: no job of A is in B: nothing compared ({only_a} only in A, {only_b} only in B)")
    on_cpu = [pair for pair in pairs if pair[1]["profiler"] == "cpu"]
    if not cpu:
        pairs = [pair for pair in pairs if pair[1]["profiler"] != "cpu"]
        if not pairs:
            raise ConvsweepError(f"compare: every job of A in B is timed on the CPU ({len(on_cpu)}): nothing compared "
                                 "(--cpu compares them)")
    values_a, values_b = samples_a.get(metric, {}), samples_b.get(metric, {})
    rows = []
    for run_a, run_b in pairs:  # run ids are per database: A's and B's may be the same numbers
        change = asdict(compare_samples(values_a.get(run_a["id"], []), values_b.get(run_b["id"], []), threshold))
        suspect = _suspect(run_a, run_b)
        if suspect:
            change["verdict"] = SUSPECT
        setting_a, setting_b = tunables_text(run_a["params"]), tunables_text(run_b["params"])
        rows.append({
            **{column: run_b[column] for column in CELL_COLUMNS},
            "setting": setting_b if setting_a == setting_b else f"{setting_a} -> {setting_b}",
            "run_a": run_a["id"], "run_b": run_b["id"], **change, "suspect": suspect,
            "checks_a": run_a["checks"], "checks_b": run_b["checks"]})
    verdicts = [row["verdict"] for row in rows]
    db_a_shown = show_url(resolve_url(db))
    db_b_shown = db_a_shown if db_b is None else show_url(resolve_url(db_b))
    return {"a": str(sel_a), "b": str(sel_b), "db_a": db_a_shown, "db_b": db_b_shown, "metric": metric,
            "threshold": threshold, "rows": rows, "only_a": only_a, "only_b": only_b,
            "cpu_left_out": 0 if cpu else len(on_cpu),
            "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))}}


def _suspect(run_a: dict, run_b: dict) -> str | None:
    """Why the pair's times cannot be held against each other: each suspect side's reasons, or None."""
    said = [f"{side} suspect: {run['error'] or 'no reason stored'}"
            for side, run in (("A", run_a), ("B", run_b)) if run["status"] == "suspect"]
    return "; ".join(said) or None


def _note(row: dict) -> str:
    """The table's note on a row: why it is SUSPECT (cut to REASON_CHARS), and which side was measured with
    fast checks (no caching test)."""
    fast = [side for side in ("a", "b") if row.get(f"checks_{side}") == "fast"]
    notes = [f"fast checks: {' and '.join(side.upper() for side in fast)}"] if fast else []
    if row.get("suspect"):
        reason = " ".join(row["suspect"].split())
        notes.insert(0, reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + "…")
    return "; ".join(notes)


def any_slower(result: dict) -> bool:
    return any(row["verdict"] == SLOWER for row in result["rows"])


# `--fail-on`: the verdicts that fail a regression gate. SUSPECT never does: its times cannot be trusted either way.
FAIL_ON = {"slower": (SLOWER,), "unsure": (SLOWER, UNSURE), "never": ()}


def gate(result: dict, fail_on: str = "slower") -> tuple[bool, str]:
    """Whether the comparison fails the gate, and the line that says why: the failing jobs by verdict,
    and the SUSPECT ones the gate passed over (a suspect time is no evidence of a change either way)."""
    if fail_on not in FAIL_ON:
        raise ConvsweepError(f"compare: unknown --fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    counts = {verdict: n for verdict, n in result["verdicts"].items() if verdict in FAIL_ON[fail_on] and n}
    failed = bool(counts)
    said = (f"gate --fail-on {fail_on}: " + ("failed: " + ", ".join(f"{n} {v}" for v, n in counts.items())
                                            if failed else "passed"))
    suspect = result["verdicts"].get(SUSPECT, 0)
    if suspect and fail_on != "never":
        said += (f"; {suspect} SUSPECT job{'s' * (suspect != 1)} ignored (the integrity checks doubt "
                 f"{'their' if suspect != 1 else 'its'} times: `convsweep query failures` says why)")
    return failed, said


def render(result: dict, fmt: str = "table") -> str:
    """A Markdown table people can paste (and a line of totals), or the data as JSON."""
    if fmt == "json":
        return json.dumps(result, indent=1)
    if fmt != "table":
        raise ConvsweepError(f"compare: unknown --format {fmt!r}: expected table or json")

    # The cell's columns, less the axes every row has at a default no table shows (convsweep.base.axes.shown).
    cell = [c for c in CELL_COLUMNS if c not in BY_NAME or c in shown(result["rows"])]
    notes = [_note(r) for r in result["rows"]]
    noted = any(notes)  # the note column only where a row has one
    rows = [[*("auto" if r[c] is None else str(r[c]) for c in cell), r["setting"], signed_percent(r["ratio"]),
             "" if r["low"] is None else f"[{signed_percent(r['low'])}, {signed_percent(r['high'])}]", r["verdict"],
             f"{r['samples_a']}/{r['samples_b']}", f"{r['run_a']} -> {r['run_b']}", *([note] if noted else [])]
            for r, note in zip(result["rows"], notes)]
    headings = [BY_NAME[column].heading if column in BY_NAME else column for column in cell]
    numeric = [column in BY_NAME and BY_NAME[column].numeric for column in cell]
    table = tabulate(rows, headers=[*headings, "setting", f"B vs A ({result['metric']})", "95% interval", "verdict",
                                    "samples A/B", "runs", *(["note"] if noted else [])],
                     tablefmt="github", disable_numparse=True,
                     colalign=[*("right" if n else "left" for n in numeric), *["left"] * (6 + noted)])
    totals = ", ".join(f"{n} {v}" for v, n in result["verdicts"].items())
    unmatched = "".join(f"; {n} job{'s' * (n != 1)} only in {side}"
                        for side, n in (("A", result["only_a"]), ("B", result["only_b"])) if n)
    if result["cpu_left_out"]:
        n = result["cpu_left_out"]
        unmatched += f"; {n} CPU-timed job{'s' * (n != 1)} left out (host times: --cpu shows them)"
    databases = f"A from {result['db_a']}, B from {result['db_b']}\n" if result["db_a"] != result["db_b"] else ""
    return (f"{databases}A = {result['a']}, B = {result['b']}: {totals}{unmatched} "
            f"(threshold {result['threshold'] * 100:g}%)\n\n{table}")
