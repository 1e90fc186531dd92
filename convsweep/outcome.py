"""What a sweep left behind, said at the end of every `snakemake` (the Snakefile's onsuccess and
onerror): per experiment, the stored settings by status, the jobs that did not finish, each distinct
reason with its count, and where to read more.

First, where an experiment's ingest could not run (one of its jobs failed, so Snakemake never started
it), the results of the jobs that did finish are stored here, and its report is written over them
(the make_report rule's command): no finished job waits for another, and `snakemake --report` finds
every file it lists.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tabulate import tabulate

from .errors import ConvsweepError, StoreError, StoreUnavailable

PREFIX = "convsweep: "  # how a job's one-line failure starts (cli.main)
# A reason is cut here so the table stays about a terminal wide; the log, or `convsweep query
# failures`, has all of it.
REASON_CHARS = 80
# A job's last words are at the end of its log; a long log (a compiler's output, say) is read from here.
LOG_TAIL_BYTES = 64 * 1024
# A stored setting's statuses in the order the counts name them; suspect (its times cannot be trusted: the
# integrity checks found a reason) is named only where a setting has it, as a sweep without the checks (the
# CPU reference) never does.
STATUSES = ("ok", "suspect", "failed", "incorrect")
NAMED_AT_ZERO = ("ok", "failed", "incorrect")
PROBLEMS = ("suspect", "failed", "incorrect")  # statuses whose settings are rows of the table, with their reason
# Rows in the order a reader acts on them: what to rerun first, then what was stored as a result.
WHAT_ORDER = ("did not finish", "not stored", "report not made", "failed", "incorrect", "suspect",
              "profile did not finish", "profile skipped", "winners not confirmed")
UNFINISHED = {"run": "did not finish", "profile": "profile did not finish", "winners": "winners not confirmed"}
LATEST_RUNS = "SELECT job_id, status, error, checks FROM latest_run WHERE experiment = :experiment"


@dataclass(frozen=True)
class JobFiles:
    """A job of the sweep as its rule names it: the result file it writes and its log."""

    job_id: str
    result: Path
    log: Path
    kind: str = "run"  # run (run_job), profile (profile_kernels: Nsight Compute) or winners (confirm_winners)


@dataclass(frozen=True)
class ExperimentFiles:
    """An experiment's jobs; its ingest record (absent, or older than a result: not all of them were
    stored by ingest_results); its report files and the report's log."""

    name: str
    jobs: list[JobFiles]
    ingested: Path
    reports: list[Path]
    report_log: Path
    report_command: list[str] = field(default_factory=list)  # make_report's, as arguments: no shell


@dataclass
class Outcome:
    """One experiment at the end of a sweep: the latest stored measurement of each setting of its
    finished jobs by status, and the count of each distinct problem, keyed (unit, what, why)."""

    experiment: str
    jobs: int
    finished: int
    statuses: Counter = field(default_factory=Counter)
    problems: Counter = field(default_factory=Counter)
    fast_checks: int = 0  # settings measured with `checks: fast` (no caching test)
    where: list[Path] = field(default_factory=list)  # the logs of the jobs that did not finish, the files not stored
    report: Path | None = None  # the report, when it is up to date
    partial: bool = False  # the report is over the jobs that finished, written at the end of the sweep


def last_reason(log: Path) -> str | None:
    """The last `convsweep: ` line of a log, without the prefix: why its job stopped. None when there
    is no such line, or no log."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    said = [line for line in text.splitlines() if line.startswith(PREFIX)]
    return said[-1][len(PREFIX):].strip() if said else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _ingested(experiment: ExperimentFiles, results: list[Path]) -> bool:
    """Whether ingest_results stored these results: its record is newer than each of them."""
    recorded = _mtime(experiment.ingested)
    return recorded is not None and all((_mtime(p) or 0) <= recorded for p in results)


def store_finished(url: str, experiment: ExperimentFiles) -> dict[Path, str]:
    """Store the experiment's results when ingest_results did not (ingest is idempotent: a stored one
    is unchanged); what could not be stored, by file. A database that cannot be used raises."""
    from .store import ingest_result, open_store, read_result

    results = [job.result for job in experiment.jobs if job.result.exists()]
    if not results or _ingested(experiment, results):
        return {}
    engine = open_store(url)
    errors = {}
    try:
        for path in results:
            try:
                ingest_result(engine, read_result(path), str(path))
            except StoreUnavailable:
                raise
            except StoreError as e:
                errors[path] = str(e)
    finally:
        engine.dispose()
    return errors


def _profile_skipped(path: Path) -> str | None:
    """Why Nsight Compute did not profile a job whose profile file says `skipped`, else None."""
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(profile, dict) or profile.get("status") != "skipped":
        return None
    return profile.get("reason") or "no reason given"


def _cut(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 1] + "…"


def collect(url: str, experiment: ExperimentFiles, not_stored: dict[Path, str]) -> Outcome:
    """The experiment's outcome: statuses from the database (the latest measurement of each setting
    of the jobs whose result is stored), the rest from the result files and the logs."""
    runs = [job for job in experiment.jobs if job.kind == "run"]
    outcome = Outcome(experiment.name, jobs=len(runs), finished=sum(job.result.exists() for job in runs))
    stored = {job.job_id for job in runs if job.result.exists() and job.result not in not_stored}
    if stored:
        from .query import fetch_dicts

        for row in fetch_dicts(url, LATEST_RUNS, {"experiment": experiment.name})[1]:
            if row["job_id"] in stored:
                outcome.statuses[row["status"]] += 1
                outcome.fast_checks += row["checks"] == "fast"
                if row["status"] != "ok":
                    outcome.problems[("setting", row["status"], _cut(row["error"] or "no reason stored"))] += 1
    for job in experiment.jobs:
        if job.result in not_stored:
            outcome.problems[("job", "not stored", _cut(not_stored[job.result].removeprefix(f"{job.result}: ")))] += 1
            outcome.where.append(job.result)
        elif not job.result.exists():
            if not job.log.exists():
                why = "waits for its cell's jobs" if job.kind == "winners" else "not started"
            else:
                why = _cut(last_reason(job.log) or "stopped without a `convsweep:` line: see its log")
                outcome.where.append(job.log)
            outcome.problems[("job", UNFINISHED[job.kind], why)] += 1
        elif job.kind == "profile" and (skipped := _profile_skipped(job.result)):
            outcome.problems[("job", "profile skipped", _cut(skipped))] += 1
    results = [job.result for job in experiment.jobs]
    if outcome.finished == outcome.jobs and not not_stored and _ingested(experiment, results):
        made = [_mtime(p) for p in experiment.reports]
        if all(t is not None and t >= _mtime(experiment.ingested) for t in made):
            outcome.report = experiment.reports[-1]
        else:
            outcome.problems[("job", "report not made", _cut(last_reason(experiment.report_log) or
                                                             f"see {experiment.report_log}"))] += 1
    return outcome


def report_what_finished(experiment: ExperimentFiles, outcome: Outcome) -> None:
    """Where some jobs of the experiment did not finish, write its report over those that did, unless it is
    newer than every result already; a report that cannot be written is a row of the table, never a stop."""
    results = [job.result for job in experiment.jobs if job.result.exists()]
    if outcome.finished == outcome.jobs or not experiment.report_command:
        return
    made = [_mtime(p) for p in experiment.reports]
    newest = max(((_mtime(p) or 0) for p in results), default=0)
    if not all(t is not None and t >= newest for t in made):
        from .paths import ROOT

        # The rule's shell puts this checkout first on PYTHONPATH; so does this, without a shell.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        experiment.report_log.parent.mkdir(parents=True, exist_ok=True)
        with open(experiment.report_log, "w") as log:
            done = subprocess.run(experiment.report_command, stdout=log, stderr=subprocess.STDOUT, env=env)
        if done.returncode != 0:
            outcome.problems[("job", "report not made", _cut(last_reason(experiment.report_log) or
                                                             f"see {experiment.report_log}"))] += 1
            return
    outcome.report, outcome.partial = experiment.reports[-1], True


def render(outcome: Outcome) -> str:
    """A few lines: the counts, then a table of the problems and where to read more (none when all is well)."""
    statuses = ", ".join(f"{outcome.statuses[s]} {s}" for s in STATUSES if s in NAMED_AT_ZERO or outcome.statuses[s])
    others = "".join(f", {n} {s}" for s, n in sorted(outcome.statuses.items()) if s not in STATUSES)
    fast = (f" ({outcome.fast_checks} measured with fast checks: no caching test)"
            if outcome.fast_checks else "")
    head = (f"{PREFIX}{outcome.experiment}: {outcome.finished} of {outcome.jobs} jobs finished; "
            f"settings stored: {statuses}{others}{fast}")
    if not outcome.problems:
        return head + (f"; report: {outcome.report}" if outcome.report else "")
    rows = [[f"{n} {unit}{'s' * (n != 1)}", what, why] for (unit, what, why), n in
            sorted(outcome.problems.items(), key=lambda item: (WHAT_ORDER.index(item[0][1]), -item[1]))]
    table = tabulate(rows, headers=["count", "what", "why"], tablefmt="simple")
    more = []
    if outcome.where:
        more.append(str(outcome.where[0]) + (f" (and {len(outcome.where) - 1} more in {outcome.where[0].parent})"
                                             if len(outcome.where) > 1 else ""))
    if any(what in PROBLEMS for _, what, _ in outcome.problems):
        more.append("`convsweep query failures`")
    lines = [head, *("  " + line for line in table.splitlines())]
    if more:
        lines.append(f"  more: {'; '.join(more)}")
    if outcome.report and outcome.partial:
        over = (f"over the {outcome.finished} job{'s' * (outcome.finished != 1)} that finished" if outcome.finished
                else "saying nothing is stored yet")
        lines.append(f"  report {over}: {outcome.report}")
    if outcome.finished < outcome.jobs:
        lines.append("  `snakemake` again retries what did not finish; `convsweep query summary` shows what is stored")
    return "\n".join(lines)


def finish_sweep(url: str, experiments: list[ExperimentFiles], out: TextIO | None = None) -> None:
    """Store what finished where ingest did not run, then print each experiment's outcome. A database or
    a folder that cannot be read is one line for its experiment, never a traceback in Snakemake's hook."""
    out = out or sys.stderr
    blocks = []
    for experiment in experiments:
        try:
            outcome = collect(url, experiment, store_finished(url, experiment))
            report_what_finished(experiment, outcome)
            blocks.append(render(outcome))
        except ConvsweepError as e:
            blocks.append(f"{PREFIX}{experiment.name}: cannot tell what was stored: {e}")
        except OSError as e:  # a results folder it may not read, say
            blocks.append(f"{PREFIX}{experiment.name}: cannot tell what was stored: {e.strerror or e} ({e.filename})")
    print("\n".join(blocks), file=out, flush=True)
