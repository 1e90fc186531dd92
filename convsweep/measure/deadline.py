"""A job's deadlines: a kernel that hangs costs its deadline, not the sweep.

`convsweep run-job` runs the job in a child process (the worker) and watches it. The worker says where it is in a
file the watcher reads (convsweep.base.heartbeat.beat): compiling, a setting begun, a pass begun; a file, not a
pipe, so that the process nsys starts under the worker (which measures there) says it too. A pass that runs past the spec's `deadline_s`, or a
compile past COMPILE_CAP_S, gets the worker's whole process group killed: its CUDA context goes with it, and
so do the GPU's lock (a flock) and any nsys under it, so the next job runs. The setting it was in is stored as
`timeout` with that line, in the job's resume store (convsweep.measure.job.ResumeStore), and a new worker
measures the settings left; a compile that hung stores every setting left as `timeout`. A setting measured before
the hang is kept: each is in the resume store as it ends (under nsys, the profiled child's are read only when it
ends, so the new worker measures them again).

A worker is the same `convsweep run-job` with `--worker`; one started by hand without a watcher has no file to
beat into, and `beat` does nothing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from convsweep.base.heartbeat import GPU_KEYS, HEARTBEAT_ENV

COMPILE_CAP_S = 600.0  # a job's kernels build in seconds; a template that never ends, never
POLL_S = 0.2


@dataclass
class Hung:
    """What the watcher killed: `what` it was doing (compile, setting or pass), the setting's index where one had
    begun, and how long it had been at it."""

    what: str
    setting: int | None
    seconds: float
    gpu: dict | None = None  # the GPU the worker said it opened (environment()'s GPU keys), where it said

    def message(self, deadline_s: float) -> str:
        if self.what == "compile":
            return (f"compiling took over {COMPILE_CAP_S:g} s: the job was killed, its settings not measured "
                    "(COMPILE_CAP_S, convsweep/measure/deadline.py)")
        return (f"a pass ran past its {deadline_s:g} s deadline (`deadline_s`): killed, with the GPU and its "
                "lock freed for the next job")


class Watch:
    """The worker's beats read from its file, and the limit the current one is held to."""

    def __init__(self, fd: int, deadline_s: float, clock=time.monotonic):
        self.fd, self.deadline_s, self.clock = fd, deadline_s, clock  # fd: the heartbeat file, read as it grows
        self.what: str | None = None  # nothing said yet: opening the GPU, the truth (no limit)
        self.setting: int | None = None
        self.gpu: dict | None = None
        self.since = clock()
        self._partial = b""

    def read(self) -> None:
        """Take in what the worker wrote since the last read."""
        data = b""
        while chunk := os.read(self.fd, 1 << 16):
            data += chunk
        if not data:
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            what, _, setting = line.decode(errors="replace").partition(" ")
            if what == "gpu":  # not a step: which GPU the worker opened
                self.gpu = _gpu_said(setting)
                continue
            self.what, self.since = what, self.clock()
            if what == "setting" and setting.strip().isdigit():
                self.setting = int(setting)

    def limit(self) -> float | None:
        if self.what == "compile":
            return COMPILE_CAP_S
        return self.deadline_s if self.what in ("setting", "pass") else None

    def overdue(self) -> Hung | None:
        limit, spent = self.limit(), self.clock() - self.since
        if limit is not None and spent > limit:
            return Hung(self.what or "", self.setting if self.what != "compile" else None, spent, self.gpu)
        return None


def _gpu_said(text: str) -> dict | None:
    """The GPU keys of a worker's `gpu` beat (a JSON object); None where they do not read as one."""
    try:
        said = json.loads(text)
    except ValueError:
        return None
    if not isinstance(said, dict):
        return None
    return {k: v for k, v in said.items() if k in GPU_KEYS and (v is None or isinstance(v, str))}


def watch(command: list[str], deadline_s: float, env: dict | None = None,
          on_line: Callable[[str], None] | None = None) -> tuple[int, Hung | None]:
    """Run the worker `command` with a file for its beats; kill its process group where a limit runs out.
    Returns its exit status and what hung (None where nothing did). `on_line`: each line of the worker's output
    (stdout and stderr), read on a thread, where the caller reads them (ncu's); else they are the watcher's. A
    watcher stopped (Ctrl-C, Snakemake's SIGTERM) stops the worker's group too."""
    def stop(signum, frame):  # the worker has a session of its own: a signal to the watcher's group misses it
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    with tempfile.NamedTemporaryFile(prefix="convsweep-heartbeat-", suffix=".txt") as beats:
        out = None if on_line is None else subprocess.PIPE
        worker = subprocess.Popen(command, env={**(os.environ if env is None else env), HEARTBEAT_ENV: beats.name},
                                  start_new_session=True, stdout=out, stderr=None if out is None else subprocess.STDOUT,
                                  text=True)
        state = Watch(os.open(beats.name, os.O_RDONLY), deadline_s)
        reader = None
        if on_line is not None:
            reader = threading.Thread(target=_read_lines, args=(worker.stdout, on_line), daemon=True)
            reader.start()
        try:
            while True:
                try:  # returns the moment the worker ends: a watched job costs no poll's wait at its end
                    status, hung = worker.wait(timeout=POLL_S), None
                    break
                except subprocess.TimeoutExpired:
                    state.read()
                if (hung := state.overdue()) is not None:
                    _kill_group(worker)
                    status = worker.wait()
                    break
        except BaseException:
            _kill_group(worker)
            raise
        finally:
            os.close(state.fd)
        if reader is not None:  # its last lines read before the caller looks at them (a grandchild may hold the
            reader.join(timeout=5)  # pipe open past the worker's end: not waited for beyond this)
        return status, hung


def _read_lines(stream, on_line: Callable[[str], None]) -> None:
    for line in stream:
        on_line(line.rstrip("\n"))


def _kill_group(worker: subprocess.Popen) -> None:
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.wait()


def supervise(spec, out_path: Path, command: list[str]) -> int:
    """The job `spec` run by workers (`command`), each killed where it hangs, until one finishes it: a hung
    setting is stored as `timeout` and the next worker measures the rest (each round stores one setting at
    least, so there are no more rounds than settings). Returns the last worker's exit status."""
    deadline_s = float(spec.deadline_s)
    while True:
        status, hung = watch(command, deadline_s)
        if hung is None:
            return status
        message = hung.message(deadline_s)
        print(f"convsweep: {spec.job_id}: {message}", flush=True)
        if not store_timeout(spec, out_path, hung, message):
            return 1


def store_timeout(spec, out_path: Path, hung: Hung, message: str) -> bool:
    """Into the job's resume store: the hung setting as `timeout` (every setting not measured, where a compile
    hung). False where none could be named (the worker hung before any setting began)."""
    from convsweep.device.provenance import environment
    from .context import JobContext
    from .job import ResumeStore, resume_key

    ctx = JobContext.open(spec)
    store = ResumeStore(out_path, resume_key(ctx))
    done = store.load()
    if hung.what == "compile":
        indices = [i for i, run in enumerate(ctx.runs) if run.run_key not in done]
    else:
        indices = [hung.setting] if hung.setting is not None and ctx.runs[hung.setting].run_key not in done else []
    store.dir.mkdir(parents=True, exist_ok=True)
    machine = environment() if indices else None  # the machine it hung on, as a crashed setting's
    if machine is not None and hung.gpu:  # the GPU the worker opened: the leaderboard ranks within its model
        machine.update(hung.gpu)
    for i in indices:
        record = ctx.measurement(i)
        record.status, record.error, record.environment = "timeout", message, machine
        assert record.timings is not None  # Measurement.new makes them
        record.timings.total_s = hung.seconds
        store.put(record)
    return bool(indices)
