"""What a sweep left behind, said at the end of every `snakemake` (the Snakefile's onsuccess and
onerror): per experiment, the stored settings by status, the jobs that did not finish, each distinct
reason with its count, and where to read more (the log of a job the row describes, which holds the
reason whole); and the sweep's exit status (finish_sweep).

First, where an experiment's ingest could not run (one of its jobs failed, so Snakemake never started
it), the results of the jobs that did finish are stored here, and its report is written over them
(the make_report rule's command): no finished job waits for another, and `snakemake --report` finds
every file it lists.

Also here: the record of the jobs a machine left out of a sweep (NotRun, `not-run.json`), what a job
that fails says on the terminal while the sweep runs (BriefFailures): a line with its id and why, and its log,
and the reasons a finished job writes whole in its log (settings_not_ok).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, cast

from tabulate import tabulate

from convsweep.base.errors import ConvsweepError, StoreError, StoreUnavailable

PREFIX = "convsweep: "  # how a job's one-line failure starts (cli.main)
# A reason is cut here so the table stays about a terminal wide; the log, or `convsweep query
# failures`, has all of it.
REASON_CHARS = 80
MORE_REASON_CHARS = 40  # a reason as a `more on` line names it, where several reasons have files
FAILURES = "`convsweep query failures`"  # every stored setting's reason, whole
# A job's last words are at the end of its log; a long log (a compiler's output, say) is read from here.
LOG_TAIL_BYTES = 64 * 1024
# A stored setting's statuses in the order the counts name them; suspect (its times cannot be trusted: the
# integrity checks found a reason) is named only where a setting has it, as a sweep without the checks (the
# CPU reference) never does.
STATUSES = ("ok", "suspect", "failed", "incorrect", "timeout")  # timeout: a pass past its deadline (measure.deadline)
NAMED_AT_ZERO = ("ok", "failed", "incorrect")
PROBLEMS = ("suspect", "failed", "incorrect", "timeout")  # statuses whose settings are rows of the table, with why
# Rows in the order a reader acts on them: what to rerun first, then what was stored as a result.
WHAT_ORDER = ("did not finish", "not stored", "report not made", "timeout", "failed", "incorrect", "suspect",
              "profile did not finish", "profile skipped", "winners not confirmed",
              "not run", "profile not run", "winners not run")
UNFINISHED = {"run": "did not finish", "profile": "profile did not finish", "winners": "winners not confirmed"}
NOT_RUN = {"run": "not run", "profile": "profile not run", "winners": "winners not run"}  # left out by the machine
NOT_RUN_FORMAT = "not-run-1"
PLANNED_FORMAT = "planned-1"
# `CONVSWEEP_GPU_JOBS=run snakemake` runs the GPU jobs even on a machine that shows no GPU (convsweep.app.plan): each
# compiles its kernels, stores a kernel that does not compile as failed, and stops where it needs the GPU.
GPU_JOBS_ENV = "CONVSWEEP_GPU_JOBS"
LATEST_RUNS = "SELECT job_id, status, error, checks FROM latest_run WHERE experiment = :experiment"


@dataclass(frozen=True)
class JobFiles:
    """A job of the sweep as its rule names it: the result file it writes and its log."""

    job_id: str
    result: Path
    log: Path
    kind: str = "run"  # run (run_job), profile (profile_kernels: Nsight Compute) or winners (confirm_winners)
    not_run: str | None = None  # why this machine left it out of the sweep (NotRun), else None: it was asked for


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
    not_run_file: Path | None = None  # NotRun's file, where jobs were left out


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
    # Per problem, where to read more: the logs of jobs that did not finish, the files not stored, the not-run record
    where: dict[tuple, list[Path]] = field(default_factory=dict)
    retry: bool = False  # some job did not finish that `snakemake` again would run (not one the machine left out)
    report: Path | None = None  # the report, when it is up to date
    partial: bool = False  # the report is over the jobs that finished, written at the end of the sweep


@dataclass(frozen=True)
class NotRun:
    """The jobs of an experiment that this machine left out of the sweep, and why (`results/<experiment>/not-run.json`,
    written before any job runs): the end-of-sweep table and the report say they were not run. No file: every job
    was asked for. `jobs` holds (kind, id) pairs, kind as JobFiles has it (run, profile or winners)."""

    reason: str
    jobs: tuple[tuple[str, str], ...]

    def write(self, path: Path) -> None:
        from convsweep.base.fileio import write_json_atomic

        write_json_atomic(path, {"format": NOT_RUN_FORMAT, "reason": self.reason,
                                 "jobs": [{"kind": kind, "id": job_id} for kind, job_id in self.jobs]})

    @classmethod
    def read(cls, path: Path) -> NotRun | None:
        """The record at `path`; None where there is none. A file of another format raises ConvsweepError."""
        data = _read_record(path, NOT_RUN_FORMAT, "the jobs not run")
        return None if data is None else cls(data["reason"], tuple((job["kind"], job["id"]) for job in data["jobs"]))


@dataclass(frozen=True)
class Planned:
    """The run jobs a sweep asks of an experiment, by id (`results/<experiment>/planned.json`, for the sweep to write
    with not-run.json before any job runs; each job's spec is in specs/): what its report compares with what is
    stored, so that it can say which jobs stopped or never started."""

    jobs: tuple[str, ...]

    def write(self, path: Path) -> None:
        """Write the record; a file already holding it is left alone, so its time says when the plan changed."""
        record = {"format": PLANNED_FORMAT, "jobs": list(self.jobs)}
        try:
            if json.loads(path.read_text()) == record:
                return
        except (OSError, ValueError):
            pass  # absent or unreadable: written below
        from convsweep.base.fileio import write_json_atomic

        write_json_atomic(path, record)

    @classmethod
    def read(cls, path: Path) -> Planned | None:
        """The record at `path`; None where there is none. A file of another format raises ConvsweepError."""
        data = _read_record(path, PLANNED_FORMAT, "the jobs a sweep plans")
        return None if data is None else cls(tuple(str(job_id) for job_id in data["jobs"]))


def _read_record(path: Path, format_: str, of: str) -> dict | None:
    """A sweep's JSON record (not-run.json, planned.json) of `format_` with its `jobs` list; None where there is none.
    One that cannot be read, or is of another format, raises ConvsweepError naming the file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConvsweepError(f"{path}: cannot read it ({e})") from None
    if not isinstance(data, dict) or data.get("format") != format_ or not isinstance(data.get("jobs"), list):
        raise ConvsweepError(f"{path}: expected a {format_} record of {of}")
    return data


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
    from convsweep.store import ingest_result, open_store, read_result

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
    stored = {job.job_id: job.log for job in runs if job.result.exists() and job.result not in not_stored}
    if stored:
        from .query import fetch_dicts

        logs: dict[tuple, dict[Path, None]] = {}  # a setting's row -> its jobs' logs, in order, each once
        for row in fetch_dicts(url, LATEST_RUNS, {"experiment": experiment.name})[1]:
            if row["job_id"] in stored:
                outcome.statuses[row["status"]] += 1
                outcome.fast_checks += row["checks"] == "fast"
                if row["status"] != "ok":
                    key = ("setting", row["status"], _cut(row["error"] or "no reason stored"))
                    outcome.problems[key] += 1
                    logs.setdefault(key, {})[stored[row["job_id"]]] = None
        # run-job writes each reason whole in its log; a log that is gone (results brought from elsewhere) is not named
        for key, found in logs.items():
            if existing := [log for log in found if log.exists()]:
                outcome.where[key] = existing
    for job in experiment.jobs:
        if job.result in not_stored:
            key = ("job", "not stored", _cut(not_stored[job.result].removeprefix(f"{job.result}: ")))
            outcome.problems[key] += 1
            outcome.where.setdefault(key, []).append(job.result)
        elif not job.result.exists() and job.not_run is not None:
            key = ("job", NOT_RUN[job.kind], _cut(job.not_run))
            outcome.problems[key] += 1
            if experiment.not_run_file is not None:
                outcome.where[key] = [experiment.not_run_file]
        elif not job.result.exists():
            outcome.retry |= job.kind == "run"
            if not job.log.exists():
                why = "waits for its cell's jobs" if job.kind == "winners" else "not started"
                key = ("job", UNFINISHED[job.kind], why)
            else:
                key = ("job", UNFINISHED[job.kind],
                       _cut(last_reason(job.log) or "stopped without a `convsweep:` line: see its log"))
                outcome.where.setdefault(key, []).append(job.log)
            outcome.problems[key] += 1
        elif job.kind == "profile" and (skipped := _profile_skipped(job.result)):
            outcome.problems[("job", "profile skipped", _cut(skipped))] += 1
    results = [job.result for job in experiment.jobs]
    if outcome.finished == outcome.jobs and not not_stored and _ingested(experiment, results):
        made = [_mtime(p) for p in experiment.reports]
        if all(t is not None and t >= cast(float, _mtime(experiment.ingested)) for t in made):  # _ingested: it has one
            outcome.report = experiment.reports[-1]
        else:
            outcome.problems[("job", "report not made", _cut(last_reason(experiment.report_log) or
                                                             f"see {experiment.report_log}"))] += 1
    return outcome


def report_what_finished(experiment: ExperimentFiles, outcome: Outcome) -> None:
    """Where some jobs of the experiment did not finish, write its report over those that did, unless it is
    newer than every result, and every log of a job without one, already; a report that cannot be written is a row
    of the table, never a stop."""
    results = [job.result for job in experiment.jobs if job.result.exists()]
    if outcome.finished == outcome.jobs or not experiment.report_command:
        return
    made = [_mtime(p) for p in experiment.reports]
    # A job that ran since the report and left no result (stopped, killed) changes what it says, as a new result does.
    attempts = [job.log for job in experiment.jobs if not job.result.exists()]
    newest = max(((_mtime(p) or 0) for p in results + attempts), default=0)
    if not all(t is not None and t >= newest for t in made):
        from convsweep.base.paths import ROOT

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
    table_lines = ["  " + line for line in table.splitlines()]
    lines = [head, *table_lines, *_more(outcome, max(map(len, table_lines)))]
    if outcome.report and outcome.partial:
        over = (f"over the {outcome.finished} job{'s' * (outcome.finished != 1)} that finished" if outcome.finished
                else "saying nothing is stored yet")
        lines.append(f"  report {over}: {outcome.report}")
    if outcome.retry:
        lines.append("  `snakemake` again retries what did not finish; `convsweep query summary` shows what is stored")
    return "\n".join(lines)


def _more(outcome: Outcome, width: int) -> list[str]:
    """Where to read more, for each reason that has a file: a log of a job that stopped for that reason or whose
    settings it describes (the first, and how many more), the result not stored, or the record of the jobs not run.
    A `more:` line alone where the reasons' files are one; else a line per reason, naming it. `convsweep query
    failures` (every stored setting's reason) ends the last line where it fits the table's `width`, and is a line of
    its own only where a setting's row has no log to name."""
    keys = sorted(outcome.where, key=lambda k: (WHAT_ORDER.index(k[1]), -outcome.problems[k]))
    said: dict[str, tuple] = {}  # what to read -> the first reason it is for
    for key in keys:
        files = outcome.where[key]
        more = f" (and {len(files) - 1} more in {files[0].parent})" if len(files) > 1 else ""
        said.setdefault(f"{files[0]}{more}", key)
    settings = [key for key in outcome.problems if key[1] in PROBLEMS]
    unnamed = any(key not in outcome.where for key in settings)
    if len(said) <= 1:
        lines = [f"  more: {file}" for file in said]
    else:
        lines = [f"  more on {what}, {_cut_to(why, MORE_REASON_CHARS)}: {file}" for file, (_, what, why) in said.items()]
    if not settings:
        return lines
    fits = bool(lines) and len(f"{lines[-1]}; {FAILURES}") <= width
    if fits or (unnamed and len(lines) == 1):
        lines[-1] += f"; {FAILURES}"
    elif unnamed or not lines:
        lines.append(f"  more: {FAILURES}")
    return lines


def _cut_to(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1].rstrip() + "…"


def finish_sweep(url: str, experiments: list[ExperimentFiles], out: TextIO | None = None,
                 cpu_sweep: str = "snakemake --configfile sweeps/cpu.yaml") -> int:
    """Store what finished where ingest did not run, then print each experiment's outcome, and where the machine
    left jobs out, a line saying how many and what runs them (`cpu_sweep`: the command of the CPU sweep). A
    database or a folder that cannot be read is one line for its experiment, never a traceback in Snakemake's
    hook. Returns the sweep's exit status: 1 where jobs were left out and have no result, or where jobs ran and no
    setting of any experiment finished ok (a line says so), else 0; some settings ok and others failed is 0."""
    out = out or sys.stderr
    blocks, outcomes = [], []
    for experiment in experiments:
        try:
            outcome = collect(url, experiment, store_finished(url, experiment))
            report_what_finished(experiment, outcome)
            blocks.append(render(outcome))
            outcomes.append(outcome)
        except ConvsweepError as e:
            blocks.append(f"{PREFIX}{experiment.name}: cannot tell what was stored: {e}")
        except OSError as e:  # a results folder it may not read, say
            blocks.append(f"{PREFIX}{experiment.name}: cannot tell what was stored: {e.strerror or e} ({e.filename})")
    not_run = sum(1 for e in experiments for job in e.jobs if job.not_run and not job.result.exists())
    if not_run:
        blocks.append(f"{PREFIX}{_count(not_run, 'job')} {'was' if not_run == 1 else 'were'} not run: `snakemake` on a "
                      f"machine with an NVIDIA GPU runs {'it' if not_run == 1 else 'them'}; `{cpu_sweep}` runs the CPU "
                      "sweep alone")
    # Only where every experiment could be read (one that could not may hold the ok ones), and some job was run.
    ran = any(job.kind == "run" and job.not_run is None for e in experiments for job in e.jobs)
    nothing_ok = ran and len(outcomes) == len(experiments) and not any(o.statuses["ok"] for o in outcomes)
    if nothing_ok:
        blocks.append(f"{PREFIX}no setting finished ok, so `snakemake` exits 1")
    print("\n".join(blocks), file=out, flush=True)
    return 1 if not_run or nothing_ok else 0


def settings_not_ok(measurements) -> list[str]:
    """What `convsweep run-job` writes in its log before its last line: a line per distinct reason a setting is not
    ok, whole (the table cuts it to a cell and points at this log), with how many settings, their status and the
    tunables of the first. `measurements`: a result file's (record.Measurement)."""
    from convsweep.sweep.config import tunables_text

    said: dict[tuple[str, str], list] = {}
    for m in measurements:
        if m.status != "ok":
            said.setdefault((m.status, m.error or "no reason stored"), []).append(m)
    return [f"{_count(len(which), 'setting')} {status} ({tunables_text(which[0].params)}"
            f"{f' and {len(which) - 1} more' if len(which) > 1 else ''}): {error}"
            for (status, error), which in said.items()]


class BriefFailures(logging.Formatter):
    """Snakemake's terminal, shortened for a sweep (the formatter of its console handler, and a filter on it):
    a job that fails is two lines, its id (experiment/log name) with why it stopped (its log's last `convsweep:`
    line) and its log, instead of Snakemake's block and the exception before it, which each print its whole
    command; the banner that names the host and Snakemake's version is left out. Snakemake's log file under
    .snakemake/log/ keeps all of it. Any other record is formatted by `formatter`, Snakemake's own."""

    def __init__(self, formatter: logging.Formatter):
        super().__init__()
        self.snakemakes = formatter

    def filter(self, record: logging.LogRecord) -> bool:
        event = str(getattr(record, "event", "") or "")
        if event == "workflow_started":
            return False
        # A job's command that exited non-zero: its block (below) says what the terminal needs.
        return not (event == "error" and getattr(record, "exception", None) == "RuleException"
                    and "CalledProcessError" in str(record.msg))

    def format(self, record: logging.LogRecord) -> str:
        if str(getattr(record, "event", "") or "") == "job_error" and (said := failed_job(getattr(record, "log", ()))):
            return said
        return self.snakemakes.format(record)


def failed_job(logs) -> str | None:
    """A failed job in two lines: `convsweep: failed: <experiment>/<log name>: <why>` and its log. None for a
    job without a log (Snakemake's block says what it has)."""
    if not logs:
        return None
    log = Path(str(logs[0]))
    why = _cut(last_reason(log) or "stopped without a `convsweep:` line: see its log")
    return f"{PREFIX}failed: {log.parent.parent.name}/{log.stem}: {why}\n  log: {log}"


def shorten_failures(workflow) -> None:
    """Make Snakemake's console handler a BriefFailures one, unless --verbose, --printshellcmds or --show-failed-logs
    asks for Snakemake's own blocks. Its log file keeps everything, and a logger plugin's output is its own;
    Snakemake 8, which has no logger manager, prints as it does."""
    settings = getattr(workflow, "output_settings", None)
    manager = getattr(workflow, "logger_manager", None)
    if manager is None or settings is None or settings.verbose or settings.printshellcmds or settings.show_failed_logs:
        return
    for handler in manager.logger.handlers:
        if handler.name == "DefaultStreamHandler" and not isinstance(handler.formatter, (BriefFailures, type(None))):
            brief = BriefFailures(handler.formatter)
            handler.setFormatter(brief)
            handler.addFilter(brief)


def machine_block(machine, cpu_jobs: int, gpu_jobs: int, left_out: bool, profilers: set[str], ncu: set[str],
                  cpu_sweep: str) -> str:
    """The block a sweep starts with: what this machine has (a provenance.Machine) and so what the sweep does with
    its `cpu_jobs` and `gpu_jobs` (runs, profiles and confirmations that need a GPU); `profilers` and `ncu` are
    what its GPU jobs ask for, which a machine without nsys or ncu changes (job.run_job, convsweep.measure.ncu)."""
    lines = [f"{PREFIX}{'' if machine.no_gpu else 'this machine: '}{machine.describe()}"]
    if left_out:
        lines += [f"  so this sweep runs its {_count(cpu_jobs, 'job')} on the CPU and leaves out the {gpu_jobs} that "
                  f"need{'s' * (gpu_jobs == 1)} a GPU; its end says what was not run, and `snakemake` exits 1",
                  f"  `{cpu_sweep}` runs the CPU sweep alone; `snakemake` on a machine with an NVIDIA GPU runs "
                  "the rest"]
    elif not gpu_jobs:
        lines.append(f"  so this sweep runs its {_count(cpu_jobs, 'job')}, all on the CPU")
    elif machine.no_gpu:
        lines.append(f"  {GPU_JOBS_ENV}=run: this sweep runs its {_count(gpu_jobs, 'GPU job')} anyway; each stops "
                     "where it needs the GPU")
    else:
        notes = []
        if not machine.nsys and profilers & {"auto", "nsys"}:
            notes.append("without nsys, " + " and ".join(
                said for asked, said in (("auto", "profiler: auto jobs are timed with CUDA events"),
                                         ("nsys", "profiler: nsys jobs stop")) if asked in profilers))
        if not machine.ncu and ncu:
            notes.append("without ncu, " + " and ".join(
                said for asked, said in (("auto", "ncu: auto profiles are skipped"), ("true", "ncu: true ones stop"))
                if asked in ncu))
        lines.append("  so this sweep runs all of its jobs" + "".join(f"; {note}" for note in notes))
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
