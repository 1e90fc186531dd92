"""One job: a cell of the sweep matrix, every tunable setting of it measured in one process.

`run_job` is what a Snakemake rule calls. It measures the settings in this process (measure.py:
the batch loads once, the GPU opens once, builds compile in parallel, each setting runs inside
NVTX range "setting <i>") or, under nsys, in a child process inside one `nsys profile`, whose
kernel and copy records then replace each setting's event timings.

One result file is written, atomically: the job and one measurement per setting (format 3,
docs/result-format.md; convsweep.measure.record writes and reads it). A setting that fails to compile or launch, or gives a wrong answer, is a
measurement too (status failed or incorrect) and the others go on. Each finished setting is also
kept in `<job>.partial/` until the file is written, so a job that was interrupted measures, when
run again, only the settings it has no result for, unless the code or inputs it measures have
changed since.

A job the machine cannot run is no result: no GPU or driver where a setting needs one, `profiler:
nsys` without nsys, a disk that cannot take its files. `run_job` then raises MachineError and writes
no result file (the finished settings stay in `<job>.partial/`), so `convsweep run-job` prints one
line and exits non-zero, and the sweep shows a failed job instead of a table of failed runs.

A job process's fixed costs are most of a small job, so `nsys profile` is started before this
process has loaded numpy, the network or the provenance, and the imports here are light (measure.py,
the network and the GPU runtime are imported where they are used). Everything up to opening the
GPU (imports, the batch, the builds, nsys's start) runs while other jobs may hold the GPU; CUDA
starts only once this job has the GPU's lock (measure.py says why).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from convsweep.device import nsys as nsys_mod
from convsweep.sweep.config import JobSpec
from .context import JobContext
from convsweep.base.errors import ConvsweepError, MachineError, writing
from convsweep.base.fileio import canonical_hash, remove_stale_temporaries, write_json_atomic
from convsweep.base.numbers import finite
from convsweep.device.provenance import environment
from .record import FORMAT, GridPlace, Measurement, ResultFile, Sample, SettingCounts, Timings, utc_now
from convsweep.model.variants import get_variant

if TYPE_CHECKING:
    from .runner import Backend


# -- resuming -----------------------------------------------------------------------------------
class ResumeStore:
    """The finished settings of a job whose result file is not written yet: `<job>.partial/`, one
    file per setting, each under the key of what it was measured from (the job, its kernels and
    their registry entries, the network and weights files). A run of the job measures only the
    settings without a stored measurement under the current key; writing the result file ends it."""

    def __init__(self, out_path: Path, key: str):
        self.dir = self.dir_of(out_path)
        self.key = key

    @staticmethod
    def dir_of(out_path: Path) -> Path:
        return out_path.with_name(out_path.stem + ".partial")

    @classmethod
    def has_partial(cls, out_path: Path) -> bool:
        """Whether an earlier run of the job left settings behind (without reading them)."""
        return cls.dir_of(out_path).is_dir()

    def load(self) -> dict[str, Measurement]:
        """run_key -> measurement of this key; files of another key (older code) are removed."""
        found = {}
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                saved = json.loads(path.read_text())
                measurement = Measurement.from_json(saved["measurement"]) if saved["resume_key"] == self.key else None
            except (OSError, ValueError, LookupError, TypeError):  # unreadable, or not a measurement
                measurement = None
            if measurement is not None:
                found[measurement.run_key] = measurement
            else:
                path.unlink(missing_ok=True)
        return found

    def put(self, measurement: Measurement) -> None:
        path = self.dir / f"{measurement.run_key}.json"
        with writing(path):
            write_json_atomic(path, {"resume_key": self.key, "measurement": measurement.to_json()})

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def resume_key(ctx: JobContext) -> str:
    """What a stored setting must have been measured from to count as measured: the job, its
    kernel sources, its variants' registry entries, and the network and weights files."""
    files = [p for p in (ctx.network.path, ctx.network.weights_path) if p is not None]
    return canonical_hash({"job": ctx.spec.job_key, "sources": ctx.sources,
                           "registry": {v.name: v.entry_hash for v in ctx.variants.values()},
                           "files": {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in files}})


# -- the job ------------------------------------------------------------------------------------
PROFILERS = ("nsys", "auto", "events")  # what a spec may ask for (the experiments schema's enum)
NSYS_MISSING_NOTE = "nsys not found: timed with CUDA events"


def run_job(spec: JobSpec, out_path: Path, process_age: float | None = None,
            backend: Backend | None = None) -> ResultFile:
    """Measure the job's settings and write its result file; returns what it wrote. A setting's
    failure is stored, never raised; a spec whose settings cannot be worked out raises ConvsweepError,
    and a machine that cannot run the job raises MachineError, with no result file at `out_path`.

    `process_age` is how long the process had run before this call (cliargs.process_age()): the
    phase process_start, counted into the job's total_s. `backend` None is the real GPU (tests
    hand in a fake one). `spec.profiler`: nsys (required), auto (nsys where it is found, else
    events, noted in each measurement) or events.
    """
    out_path = Path(out_path)
    with no_result_on_machine_error(out_path):
        return _run_job(spec, out_path, process_age, backend)


@contextmanager
def no_result_on_machine_error(out_path: Path) -> Iterator[None]:
    """Around a job that writes `out_path`: on MachineError no file is left there. The workflow takes
    the file as the job's outcome, and one from an earlier run would pass this one off as measured."""
    try:
        yield
    except MachineError:
        try:
            out_path.unlink(missing_ok=True)
        except OSError:  # a read-only disk refuses even this; it took no new file either
            pass
        raise


def _run_job(spec: JobSpec, out_path: Path, process_age: float | None, backend: Backend | None) -> ResultFile:
    started, started_at = time.perf_counter(), utc_now()
    remove_stale_temporaries(out_path)
    if spec.profiler not in PROFILERS:
        raise ConvsweepError(f"profiler: expected one of {', '.join(PROFILERS)}, got {spec.profiler!r}")
    on_gpu = not all(get_variant(name).is_cpu for name in spec.variants.values())
    # A graph replay is timed whole (convsweep.base.axes, timer): nsys could not split it into layers.
    profiled = spec.profiler in ("nsys", "auto") and on_gpu and spec.timer == "events"
    nsys_path = nsys_mod.find_nsys() if profiled else None
    if spec.profiler == "nsys" and on_gpu and nsys_path is None:
        if backend is None:
            from .runner import Backend

            backend = Backend()
        backend.devices()  # a machine without a GPU says that first: nsys alone would not let it run the job
        raise MachineError("profiler: nsys asked for but nsys is not on PATH or $NSYS")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nsys") as pool:
        child = None
        if nsys_path and not ResumeStore.has_partial(out_path):  # nothing to resume: start every setting now
            child = ProfiledChild(pool, spec, None, out_path, nsys_path)
        ctx = JobContext.open(spec)
        resume = ResumeStore(out_path, resume_key(ctx))
        stored = resume.load()
        todo = [i for i, run in enumerate(ctx.runs) if run.run_key not in stored]
        told = told_before(stored)
        print(f"{spec.job_id}: {_counted(ctx)}"
              + (f", {len(ctx.runs) - len(todo)} of them measured before" if len(todo) < len(ctx.runs) else ""),
              flush=True)
        fresh: list[Measurement] = []

        def keep(measurement: Measurement) -> None:
            resume.put(measurement)
            fresh.append(measurement)

        shared: dict = {}
        files: dict = {}
        if todo and nsys_path:
            child = child or ProfiledChild(pool, spec, todo, out_path, nsys_path, told)
            shared, files = _measure_under_nsys(ctx, todo, child, keep)
        elif todo:
            from .settings import measure_settings
            from .runner import Backend

            shared = measure_settings(ctx, todo, backend or Backend(), keep, told)
            if spec.profiler == "auto" and profiled:
                for m in fresh:
                    m.profiler_note = NSYS_MISSING_NOTE
    shared = {"process_start": process_age, **shared} if process_age is not None else shared
    wall = (process_age or 0.0) + time.perf_counter() - started
    _share_job_time(fresh, shared, wall)
    by_key = {**stored, **{m.run_key: m for m in fresh}}
    if ctx.settings.guided:  # the settings it proposed, in that order
        measurements = sorted(by_key.values(), key=_proposal)
    else:
        measurements = [by_key[run.run_key] for run in ctx.runs]
    result = ResultFile(FORMAT, spec.job_id, spec.job_key, spec.to_dict(), spec.sweep,
                        SettingCounts(ctx.settings.valid, len(fresh), len(stored)),
                        started_at, wall, {k: finite(v) for k, v in shared.items()}, files, measurements)
    result.write(out_path)
    resume.clear()
    return result


def _counted(ctx: JobContext) -> str:
    settings = ctx.settings
    if settings.guided:
        return f"up to {settings.budget} of {settings.valid} valid settings, as {ctx.spec.search['strategy']} proposes them"
    return f"{len(ctx.runs)} of {settings.valid} valid settings"


def _proposal(m: Measurement) -> int:
    """Where a guided search proposed a setting (0 first): each it measured has its place."""
    assert m.grid is not None and m.grid.proposal is not None
    return m.grid.proposal


def told_before(stored: dict[str, Measurement]) -> list[tuple[int, dict[str, float] | None]]:
    """What a resumed guided search measured before: (index, each layer's op time) in the order proposed."""
    from convsweep.sweep.search import objective

    done = sorted((m for m in stored.values() if m.grid and m.grid.proposal is not None), key=_proposal)
    return [(cast(GridPlace, m.grid).index, objective(m.status, m.timings.op_time_ms if m.timings else None))
            for m in done]


def _share_job_time(fresh: list[Measurement], shared: dict, wall: float) -> None:
    """Give each setting measured now an equal share of what the job spent on all of them (process
    start, loading, the GPU context, compiling, nsys): its phases gain the shared phases over n, and
    its total_s is its own time plus 1/n of the rest, so a job's settings add up to its wall time."""
    if not fresh:
        return
    n = len(fresh)
    # A job's measurements (ctx.measurement's, or the child's whole records) have their timings and phases.
    rest = max(0.0, wall - sum(cast(Timings, m.timings).total_s or 0.0 for m in fresh))
    for m in fresh:
        assert m.timings is not None and m.phases_s is not None
        m.phases_s = {k: finite(v) for k, v in {**{k: v / n for k, v in shared.items() if v is not None},
                                                 **m.phases_s}.items()}
        m.timings.total_s = (m.timings.total_s or 0.0) + rest / n


# -- under nsys ---------------------------------------------------------------------------------
class ProfiledChild:
    """`convsweep measure` for settings `todo` (None: all of them) in a child process under one
    `nsys profile`, run on a pool thread so that this process prepares while nsys starts (~2 s)."""

    def __init__(self, pool: ThreadPoolExecutor, spec: JobSpec, todo: list[int] | None, out_path: Path,
                 nsys_path: str, told: Sequence[tuple[int, dict[str, float] | None]] = ()):
        self._tmp = tempfile.TemporaryDirectory()
        spec_file, self.progress = Path(self._tmp.name) / "job.json", Path(self._tmp.name) / "measured.jsonl"
        spec_file.write_text(json.dumps({"job": {**spec.to_dict(), "sweep": spec.sweep}, "settings": todo,
                                         "told": list(told)}))
        self.report_base = out_path.with_suffix("")
        command = [sys.executable, "-m", "convsweep.app.cli", "measure", "--spec-file", str(spec_file),
                   "--out", str(self.progress)]
        self._started = time.perf_counter()
        self._future: Future = pool.submit(self._profile, command, nsys_path)

    def _profile(self, command: list[str], nsys_path: str) -> tuple[Path | None, str | None, float]:
        try:
            sqlite_path, problem = nsys_mod.profile(command, self.report_base, nsys_path, log=None), None
        except ConvsweepError as e:
            sqlite_path, problem = None, str(e)
        return sqlite_path, problem, time.perf_counter() - self._started

    def wait(self) -> tuple[Path | None, str | None, float, list[dict]]:
        """(the SQLite export or None, what went wrong or None, nsys's wall seconds, the child's lines)."""
        try:
            sqlite_path, problem, wall = self._future.result()
            return sqlite_path, problem, wall, read_progress(self.progress)
        finally:
            self._tmp.cleanup()


def _measure_under_nsys(ctx: JobContext, todo: list[int], child: ProfiledChild,
                        keep: Callable[[Measurement], None]) -> tuple[dict, dict]:
    """Wait for the child, then give each setting the kernel and copy records of its NVTX range. A
    setting the child never finished (it crashed) is stored as failed; nsys failing fails every
    setting with its message; the child's machine failing (its `machine` line) is raised as the job's,
    after what it did finish is kept."""
    spec = ctx.spec
    sqlite_path, problem, wall, lines = child.wait()
    inner_shared: dict[str, Any] = next((line["shared"] for line in lines if "shared" in line), {})
    finished = [Measurement.from_json(line["measurement"]) for line in lines if "measurement" in line]
    measured = {m.grid.index: m for m in finished}
    machine = next((line["machine"] for line in lines if "machine" in line), None)
    if machine is not None:
        for m in measured.values():  # settings known without the machine (compile errors): kept to resume
            keep(m)
        raise MachineError(machine)
    summaries = {}
    t = time.perf_counter()
    if sqlite_path is not None:
        conv_names = list(ctx.variants)
        activities = nsys_mod.read_activities(sqlite_path, {layer.name for layer in ctx.network.layers})
        discarded: dict[int | None, list[int]] = {i: m.stopping.discarded for i, m in measured.items()
                                                  if m.stopping and m.stopping.discarded}
        summaries = nsys_mod.summarize_settings(activities, conv_names, discarded)
    read_s = time.perf_counter() - t
    files = {"nsys_report": str(child.report_base.with_suffix(".nsys-rep")), "nsys_sqlite": str(sqlite_path)} \
        if sqlite_path is not None else {}
    # A guided search's settings are those the child's search proposed; an up-front one's, all it was given.
    for i in (list(measured) if ctx.settings.guided else todo):
        m = measured.get(i)
        if m is None:
            m = ctx.measurement(i)
            m.error = problem or "the measuring process ended before this setting (it crashed: see the job log)"
            m.environment = environment()
            assert m.timings is not None  # ctx.measurement's
            m.timings.total_s = 0.0
        elif m.status != "failed":
            _apply_nsys(m, summaries.get(i), problem, m.stopping.samples if m.stopping else spec.repeats)
            _judge_again(m, ctx)
        m.files = files
        keep(m)
    own = sum(v for v in inner_shared.values() if v) + sum(m.timings.total_s or 0 for m in measured.values())
    return {**inner_shared, "profile": max(0.0, wall - own), "nsys_read": read_s}, files


def _apply_nsys(m: Measurement, summary: dict | None, problem: str | None, repeats: int) -> None:
    """Replace a setting's event timings with its nsys records (nsys.summarize_settings's summary);
    keep the event forward pass beside them. `repeats`: the timed passes the child took (the
    stopping rule's count)."""
    seen = summary["repeats_seen"] if summary else 0
    if problem or seen != repeats:
        m.status = "failed"
        m.error = problem or f"nsys report holds {seen} timed repeats of this setting, expected {repeats}"
        return
    assert summary is not None and m.timings is not None  # nsys holds its passes (seen == repeats); it was measured
    t, event_forward = m.timings, m.timings.forward_ms
    t.h2d_ms, t.d2h_ms, t.compute_ms, t.forward_ms, t.overlap, t.streams_used = (
        finite(summary[k]) for k in ("h2d_ms", "d2h_ms", "compute_ms", "forward_ms", "overlap", "streams_used"))
    t.op_time_ms = {k: finite(v) for k, v in summary["op_time_ms"].items()}
    t.event_forward_ms = event_forward
    m.profiler, m.kernels, m.memcpys = "nsys", summary["kernels"], summary["memcpys"]
    m.samples = [Sample.from_json(s) for s in summary["samples"]]


def _judge_again(m: Measurement, ctx: JobContext) -> None:
    """With nsys's times in place of the events': its view of every stream against the events, the
    floors held to the new times, and the status those give (convsweep.measure.integrity)."""
    from .integrity import judge_floors, judge_nsys, settle

    if m.status == "failed" or m.integrity is None:
        return
    assert m.timings is not None  # a measured setting's
    judge_nsys(m, m.timings.forward_ms)
    judge_floors(m, ctx.network)
    settle(m)


def read_progress(path: Path) -> list[dict]:
    """The child's lines: one per finished setting, then its shared phases; a line cut short by a
    crash is left out."""
    lines: list[dict] = []
    try:
        text = path.read_text()
    except OSError:
        return lines
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return lines


def measure_to_file(spec: JobSpec, todo: list[int] | None, out_path: Path,
                    told: Sequence[tuple[int, dict[str, float] | None]] = ()) -> None:
    """The child half of a job under nsys (or ncu): measure settings `todo` (None: all), appending each
    finished one to `out_path` (one JSON line, flushed) and last the phases the settings shared. A
    machine that cannot run them is told to the parent as a line {"machine": message}, then raised."""
    from .settings import measure_settings
    from .runner import Backend

    ctx = JobContext.open(spec)
    with open(out_path, "a") as out:
        def write(line: dict) -> None:
            out.write(json.dumps(line) + "\n")
            out.flush()

        indices = list(range(len(ctx.runs))) if todo is None else todo
        try:
            shared = measure_settings(ctx, indices, Backend(), lambda m: write({"measurement": m.to_json()}), told)
        except MachineError as e:
            write({"machine": str(e)})
            raise
        write({"shared": shared})
