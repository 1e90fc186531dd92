"""`convsweep watch`: the edit loop in one step. On each save of a kernel (kernels/*.cu, *.cuh, variants.yaml) or
of the sweep file it runs Snakemake as a plain `snakemake` would, shows a line per job that finished, and compares
each job measured in that round with its measurement before (`convsweep compare previous latest`, never a gate).

Snakemake decides what to re-measure (the files and registry entries each job depends on: convsweep.app.plan), writes
every result and stores it; watch only starts it, reads it and queries. Its one file is Snakemake's whole output
of the last round, written atomically when the round ends, however it ends: WATCH_LOG.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from convsweep.analysis.compare import COMPARED, compare, render
from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import write_atomic
from convsweep.analysis.outcome import PREFIX, last_reason
from convsweep.base.paths import KERNELS_DIR, REGISTRY_PATH
from convsweep.analysis.query import fetch_dicts

WATCH_LOG = Path(".snakemake") / "watch.log"  # beside Snakemake's own logs, in the directory it runs in
KERNEL_SUFFIXES = (".cu", ".cuh")
# An editor's save (write, rename, chmod) and a `git checkout` of several files are one round, not several.
DEBOUNCE_MS = 1600
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long a stopped Snakemake may take to stop its jobs, as it does on Ctrl-C, before they are killed.
STOP_GRACE_S = 60
LOG_TAIL_BYTES = 4096  # a finished job's summary is its log's last line

Say = Callable[[str], None]


@dataclass(frozen=True)
class WatchOptions:
    configfile: str | None = None  # None: experiments.yaml, as a plain `snakemake`
    experiment: str | None = None  # run and compare this experiment of the sweep file alone
    cores: int | None = None  # None: the profile's (profiles/default)
    cpu: bool = False  # compare the CPU-timed jobs too, as `compare --cpu`
    threshold: float = 0.05


def watch(options: WatchOptions, out=None, stop_event=None) -> None:
    """Wait for saves and run a round on each, until Ctrl-C, SIGTERM or SIGHUP (or `stop_event`, for tests)."""
    out = out or sys.stdout
    sweep = Path(options.configfile or "experiments.yaml")
    if not sweep.is_file():
        raise ConvsweepError(f"watch: no sweep file {sweep}")

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    import watchfiles

    waiting = f"watching {_shown(KERNELS_DIR)}/ and {sweep}: each save re-measures what it changed (Ctrl-C stops)"
    # SIGTERM and SIGHUP stop watch as Ctrl-C does, so Snakemake is never left running without it; SIGINT too
    # where the shell that started watch left it ignored (`&` in a script).
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    for number in STOP_SIGNALS:
        signal.signal(number, signal.default_int_handler)
    try:
        say(waiting)
        # Not recursive: kernels/ is flat, and the sweep file's folder may be the checkout's root, results and all.
        for changes in watchfiles.watch(KERNELS_DIR, sweep.resolve().parent, watch_filter=_Saved(sweep),
                                        debounce=DEBOUNCE_MS, stop_event=stop_event, recursive=False):
            say("saved: " + ", ".join(sorted({_shown(Path(path)) for _, path in changes})))
            run_round(options, sweep, say)
            say(waiting)
    except KeyboardInterrupt:
        say("watch: stopped; nothing is half-written (`snakemake` again finishes a round it cut off)")
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class _Saved:
    """watchfiles' filter: the kernels and headers in kernels/, the registry, and the sweep file."""

    def __init__(self, sweep: Path):
        self.sweep = os.path.realpath(sweep)
        self.kernels = os.path.realpath(KERNELS_DIR)

    def __call__(self, change, path: str) -> bool:
        real = os.path.realpath(path)
        if os.path.dirname(real) == self.kernels:
            return real.endswith(KERNEL_SUFFIXES) or os.path.basename(real) == REGISTRY_PATH.name
        return real == self.sweep


def run_round(options: WatchOptions, sweep: Path, say: Say) -> None:
    """Snakemake over the sweep (or one experiment of it), then the comparison of the jobs it measured."""
    try:
        plan = _plan(sweep)
        targets = _targets(plan, options.experiment)
    except ConvsweepError as e:  # the edit broke the registry or the sweep: Snakemake would stop at the same line
        say(f"{PREFIX}{e}")
        return
    before = _last_run_id(plan.db_url)
    # The targets first: --configfile takes every word after it.
    command = [sys.executable, "-m", "snakemake", *targets, *(["--cores", str(options.cores)] if options.cores else []),
               *(["--configfile", str(sweep)] if options.configfile else [])]
    hidden = set(plan.experiments) - {options.experiment} if options.experiment else set()
    started = time.monotonic()
    progress = _Progress(say, hidden)
    status = run_snakemake(command, progress.feed)
    ended = f"exited with status {status}" if status else "finished"
    say(f"  snakemake {ended} in {time.monotonic() - started:.0f} s; its whole output: {WATCH_LOG}")
    compare_round(plan.db_url, before, options, say)


def _plan(sweep: Path):
    """The sweep as the Snakefile plans it, read afresh."""
    from .plan import SweepPlan
    from convsweep.base.yamlio import read_yaml_file

    return SweepPlan(read_yaml_file(sweep), sweep)  # the registry is read again where it was saved since


def _targets(plan, experiment: str | None) -> list[str]:
    """Snakemake's targets: none (rule all) for the whole sweep, else rule all's files of that experiment."""
    if experiment is None:
        return []
    if experiment not in plan.experiments:
        raise ConvsweepError(f"watch: --experiment {experiment!r} is not in {plan.config.path} "
                             f"(it has {', '.join(plan.experiments)})")
    return [target for target in plan.targets() if target.startswith(f"{plan.results_dir}/{experiment}/")]


def _last_run_id(db: str) -> int:
    """The newest stored run's id: the runs of a round are those after it. 0 before the first sweep."""
    try:
        return fetch_dicts(db, "SELECT max(id) AS id FROM run")[1][0]["id"] or 0
    except ConvsweepError:  # no database yet
        return 0


def run_snakemake(command: list[str], feed: Callable[[str], None]) -> int:
    """Run Snakemake, handing each line of its output to `feed`, and return its exit status. Interrupted, it stops
    Snakemake and its jobs as Ctrl-C in its terminal would (they are a process group of their own, so a Ctrl-C
    reaches them once, from here), waits for it, and raises again. Its output goes to WATCH_LOG in every case."""
    lines: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None  # stdout=PIPE
    try:
        for line in proc.stdout:
            lines.append(line)
            feed(line.rstrip("\n"))
        return proc.wait()
    except KeyboardInterrupt:
        lines += _stop(proc)
        raise
    finally:
        write_atomic(WATCH_LOG, "".join(lines))


def _stop(proc: subprocess.Popen) -> list[str]:
    """SIGINT to Snakemake's process group (its jobs stop and it removes their unfinished outputs), then SIGKILL
    if it has not exited within STOP_GRACE_S; the rest of its output. A second Ctrl-C meanwhile is ignored: it
    must not orphan Snakemake."""
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        rest, _ = proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rest, _ = proc.communicate()
    return [rest or ""]


class _Progress:
    """Snakemake's output in short: a line per job that finished or failed, and convsweep's own lines (the sweep's
    outcome, convsweep.analysis.outcome's, less the experiments in `hidden`)."""

    def __init__(self, say: Say, hidden: set[str]):
        self.say, self.hidden = say, hidden
        self.jobs: dict[str, dict[str, str]] = {}  # Snakemake's jobid -> its block's fields
        self.block: dict[str, str] | None = None
        self.finished: dict[str, str] | None = None
        self.outcome = False  # inside an outcome block: its table's lines are indented
        self.error = False  # after Snakemake's own error (its name on a line): its message's first line is shown

    def feed(self, line: str) -> None:
        if self.block is not None and (field := re.match(r"\s+(\w+): (.*)$", line)):
            self.block[field[1]] = field[2]
            return
        if self.block is not None:
            self._end_block()
        if rule := re.match(r"(?:local)?rule (\w+):$", line):
            self.block = {"rule": rule[1]}
        elif rule := re.match(r"Error in rule (\w+):$", line):
            self.block = {"rule": rule[1], "error": "yes"}
        elif done := re.match(r"Finished job(?:id:)? (\d+)\b", line):  # Snakemake 9's, and 8's "Finished job 2."
            self.finished = self.jobs.get(done[1])
        elif steps := re.match(r"(\d+) of (\d+) steps", line):
            if self.finished and self.finished["rule"] != "all":
                self.say(f"  [{steps[1]}/{steps[2]}] {self._done(self.finished)}")
            self.finished = None
        elif line.startswith("Nothing to be done"):
            self.say("  nothing to re-measure: every job is up to date with the files it depends on")
        elif re.match(r"[A-Z]\w*(Error|Exception):", line):
            self.say(f"  snakemake: {line}")
            self.error = line.endswith(":")
        elif self.error and line.strip():
            self.say(f"  snakemake: {line.strip()}")
            self.error = False
        elif line.startswith(PREFIX):
            self.outcome = not any(line.startswith(f"{PREFIX}{name}: ") for name in self.hidden)
            if self.outcome:
                self.say(line)
        elif self.outcome and line.startswith("  "):
            self.say(line)
        else:
            self.outcome = False

    def _end_block(self) -> None:
        block, self.block = self.block, None
        assert block is not None  # only a block that is open ends
        if "error" not in block:
            self.jobs[block.get("jobid", "")] = block
            return
        log = block.get("log", "").split(" (")[0]
        why = (last_reason(Path(log)) if log else None) or (f"see {log}" if log else "see its error above")
        self.say(f"  failed: {block['rule']} {block.get('wildcards', '')}: {why}")

    @staticmethod
    def _done(block: dict[str, str]) -> str:
        """A finished job in a line: a run_job's summary (its log's last line), else the rule and its wildcards."""
        log = block.get("log")
        if block["rule"] == "run_job" and log:
            try:
                with open(log, "rb") as f:
                    f.seek(max(0, f.seek(0, 2) - LOG_TAIL_BYTES))
                    said = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
                if said:
                    return said[-1]
            except OSError:
                pass
        return f"{block['rule']} {block.get('wildcards', '')}".strip()


def compare_round(db: str, before: int, options: WatchOptions, say: Say) -> None:
    """`convsweep compare previous latest` over the jobs measured since run `before` alone (of the experiment, if
    one is watched): its table, or the line saying why there is none. Never a gate."""
    try:
        _, new = fetch_dicts(db, "SELECT id, experiment, profiler, status FROM run WHERE id > :before",
                             {"before": before})
    except ConvsweepError as e:
        say(f"compare: {e}")
        return
    new = [run for run in new if options.experiment in (None, run["experiment"])]
    profiler = {run["id"]: run["profiler"] for run in new if run["status"] in COMPARED}
    if not profiler:
        say(f"compare: nothing to compare: {'no job was measured' if not new else 'no setting measured'} in this "
            f"round{' was ok' if new else ''}")
        return
    try:
        result = compare(db, "previous", "latest", threshold=options.threshold, cpu=True)
    except ConvsweepError as e:  # no job has two measurements yet, say
        say(str(e))
        return
    # A job measured this round is one whose newest ok or suspect run is new; one that failed this round keeps
    # an older newest run, and its failure was shown above (the sweep's outcome).
    rows = [row for row in result["rows"] if row["run_b"] in profiler]
    on_cpu = 0 if options.cpu else sum(profiler[row["run_b"]] == "cpu" for row in rows)
    rows = [row for row in rows if options.cpu or profiler[row["run_b"]] != "cpu"]
    if not rows:
        why = (f"{on_cpu} timed on the CPU (--cpu compares them)" if on_cpu else
               "none has an ok measurement before this round's, or this round's failed")
        say(f"compare: no job measured in this round is compared: {why}")
        return
    verdicts = [row["verdict"] for row in rows]
    say(render({**result, "rows": rows, "only_a": 0, "only_b": 0, "cpu_left_out": on_cpu,
                "verdicts": {verdict: verdicts.count(verdict) for verdict in sorted(set(verdicts))}}))


def _shown(path: Path) -> str:
    """A path relative to the working directory when inside it, else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
