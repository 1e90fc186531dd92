"""One job: a cell of the sweep matrix, every tunable setting of it measured in one process.

`run_job` is what a Snakemake rule calls. The batch and its float64 reference are loaded once,
the GPU is opened once, every setting's builds compile in parallel (through the disk cache),
then the settings are measured one after another, each inside NVTX range "setting <i>" with
buffers of its own: warm-up, timed repeats, check. Under nsys that measuring runs in a child
process inside one `nsys profile`, and each setting's kernel and copy records replace its
event timings.

Whatever happens, one result file is written, atomically: the job and one measurement per
setting (format 3, docs/result-format.md). A setting that fails to compile or launch, or gives
a wrong answer, is a measurement too (status failed or incorrect) and the others go on. Each
finished setting is also kept in `<job>.partial/` until the file is written, so a job that was
interrupted measures, when run again, only the settings it has no result for, unless the code
or inputs it measures have changed since.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import nsys as nsys_mod
from .checks import check_logits
from .compile import LAYERS_SOURCE, BuildRequest, source_hash
from .config import JobSpec, RunSpec, Settings, tunables_text
from .errors import CompileError, ConvsweepError, failure_message
from .fileio import canonical_hash, remove_stale_temporaries, write_json_atomic
from .gpulock import gpu_lock
from .inputs import Batch, load_batch
from .network import Network, load_network, reference_layer
from .numbers import finite, median
from .paths import relative_to_root, resolve_network_path
from .provenance import GpuMonitor, environment, git_state, host_gpu_arch
from .runner import (Backend, ConvPlan, PipelineBuffers, nvtx_range, pass_chunks, pipeline_buffers, pipeline_pass,
                     poison_logits)
from .variants import Variant, get_variant

# The result format written: the newest of workflow/schemas/result.schema.yaml (a store test ties
# the two; reading the schema here would cost every job process its parse).
FORMAT = 3

def kernel_sources_of(variants: dict[str, Variant]) -> dict[str, str]:
    """{kernel file: source hash} of every kernel a job runs: its variants' files and, on the GPU,
    layers.cu. Known before anything compiles, so a run that failed still says what code it tried."""
    files = [v.source for v in variants.values() if not v.is_cpu]
    if files:
        files.append(LAYERS_SOURCE)
    return {relative_to_root(f): source_hash(f) for f in dict.fromkeys(files)}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


# -- one setting's record -----------------------------------------------------------------------
@dataclass
class JobContext:
    """What every setting of a job shares: its spec and settings, the batch, the variants, and the
    provenance each measurement repeats (so each stands alone in the store)."""

    spec: JobSpec
    runs: list[RunSpec]
    settings: Settings
    network: Network
    batch: Batch | None
    variants: dict[str, Variant]
    provenance: dict
    keep_logits: bool = False  # leave each setting's output array in its measurement (never in files)
    compile_errors: dict[int, str] = field(default_factory=dict)  # found when the GPU could not be opened

    @classmethod
    def open(cls, spec: JobSpec) -> "JobContext":
        """The settings and provenance; the batch is loaded by measure_settings (a failure to load
        it is the measurements' failure, not the job's)."""
        settings = spec.settings()
        variants = {layer: get_variant(name) for layer, name in spec.variants.items()}
        return cls(spec, spec.runs(), settings, load_network(resolve_network_path(spec.network)), None, variants,
                   {"git": git_state(), "sources": kernel_sources_of(variants)})

    def skeleton(self, index: int) -> dict:
        """A measurement before measuring: identity and provenance; `failed` until measured."""
        run = self.runs[index]
        return {"measurement_id": uuid.uuid4().hex, "job_id": self.spec.job_id, "run_key": run.run_key,
                "spec": run.to_dict(), "sweep": self.spec.sweep, **self.provenance,
                "grid": {"job_key": self.spec.job_key, "index": index, "settings": len(self.runs),
                         "valid": self.settings.valid, "search": self.spec.search},
                "clocks": {"sm_mhz": None, "memory_mhz": None}, "environment": None,
                "status": "failed", "error": None, "profiler": None, "started_at": _now(),
                "accuracy": None, "max_rel_err": None, "tolerance": None, "images": None,
                "timings": {"op_time_ms": {}, "h2d_ms": None, "d2h_ms": None, "compute_ms": None, "forward_ms": None,
                            "overlap": None, "streams_used": None, "total_s": None, "compile_ms": None},
                "phases_s": {}, "floors": {}, "samples": [], "builds": [], "kernels": [], "memcpys": [], "files": {}}


def _timings_from_samples(samples: list[dict], conv_names: list[str]) -> dict:
    def med(metric, layer=None):
        return finite(median(s["value"] for s in samples if s["metric"] == metric and s["layer"] == layer))

    return {"op_time_ms": {name: med("op_time_ms", name) for name in conv_names},
            "h2d_ms": med("h2d_ms"), "d2h_ms": med("d2h_ms"), "compute_ms": med("compute_ms"),
            "forward_ms": med("forward_ms"), "overlap": med("overlap"), "streams_used": med("streams_used")}


def _complete(record: dict, measured: dict, ctx: JobContext) -> None:
    """Fold one setting's measurement into its record and check its logits against float64."""
    batch, run = ctx.batch, ctx.runs[record["grid"]["index"]]
    logits = measured.pop("logits")
    check = check_logits(logits, batch.reference, batch.dataset.labels, batch.idx, ctx.variants.values())
    timings = measured.pop("timings")
    record.update(measured, **check.record(), tolerance=max(v.tolerance for v in ctx.variants.values()),
                  images={"batch": run.batch, "unique": len(batch.dataset.images),
                          "cycled": run.batch > len(batch.dataset.images)},
                  floors={layer.name: {"bytes": s.min_bytes, "flops": s.flops} for layer in batch.network.conv_layers
                          for s in [batch.network.conv_shape(layer, run.batch)]})
    record["timings"].update(timings)
    missed = [b["compile_ms"] for b in record["builds"] if not b["cache_hit"]]
    record["timings"]["compile_ms"] = sum(missed) if record["builds"] else None
    if ctx.keep_logits:
        record["logits"] = logits


# -- measuring in this process ------------------------------------------------------------------
@dataclass
class GpuSession:
    """The GPU side every setting of a job shares: device, streams, the batch's host and device
    buffers, the NVML monitor, the chunking of a pass, and the backend that builds networks."""

    gpu: object
    streams: list
    buffers: PipelineBuffers
    monitor: GpuMonitor
    chunks: list[tuple[int, int]]
    backend: Backend
    arch: str  # what the builds target


def measure_settings(ctx: JobContext, todo: list[int], backend: Backend = Backend(),
                     on_measured: Callable[[dict], None] = lambda m: None) -> dict:
    """Measure settings `todo` (indices into ctx.runs) in this process; each finished measurement
    goes to `on_measured` as it is made. Returns the seconds of the phases they shared. A failure
    before any setting could run (data, device) is every remaining setting's failure."""
    shared: dict[str, float] = {}
    done: set[int] = set()

    def finish(record: dict, own_s: float) -> None:
        record["timings"]["total_s"] = own_s  # its own time; run_job adds its share of the job's
        done.add(record["grid"]["index"])
        on_measured(record)

    try:
        t = time.perf_counter()
        ctx.batch = load_batch(ctx.network, ctx.spec.dataset, ctx.spec.batch)
        _ = ctx.batch.images
        shared["load"] = time.perf_counter() - t
        t = time.perf_counter()
        _ = ctx.batch.reference  # from the disk cache, or computed once for every setting
        shared["reference"] = time.perf_counter() - t
        cpu = {v.is_cpu for v in ctx.variants.values()}
        if cpu == {True}:
            _measure_cpu_settings(ctx, todo, finish)
        elif cpu == {False}:
            _measure_gpu_settings(ctx, todo, backend, shared, finish)
        else:
            raise ConvsweepError("a job cannot mix the CPU 'reference' variant with GPU variants")
    except Exception as e:  # the job's own failure: every setting not yet measured is stored with it
        message, env = failure_message(e), environment()
        for i in todo:
            if i not in done:
                record = ctx.skeleton(i)
                record.update(error=ctx.compile_errors.get(i, message), environment=env)
                finish(record, 0.0)
    return shared


def _measure_cpu_settings(ctx: JobContext, todo: list[int], finish) -> None:
    """The CPU reference: synchronous numpy, so a host clock around each layer is an honest timer."""
    network, images = ctx.batch.network, ctx.batch.images
    conv_names = [layer.name for layer in network.conv_layers]
    dtype = np.dtype(network.dtype)
    cast = {k: v.astype(dtype) for k, v in ctx.batch.weights.items()}
    for i in todo:
        started, record, run, samples, phases = time.perf_counter(), ctx.skeleton(i), ctx.runs[i], [], {}

        def forward(repeat):
            x = images.astype(dtype)
            t0 = time.perf_counter()
            for layer in network.layers:
                t = time.perf_counter()
                x = reference_layer(layer, cast, x)
                if repeat is not None and layer.name in conv_names:
                    samples.append({"metric": "op_time_ms", "layer": layer.name, "repeat": repeat,
                                    "value": (time.perf_counter() - t) * 1e3})
            if repeat is not None:
                samples.append({"metric": "forward_ms", "layer": None, "repeat": repeat,
                                "value": (time.perf_counter() - t0) * 1e3})
            return x

        t = time.perf_counter()
        for _ in range(run.warmup):
            forward(None)
        phases["warmup"] = time.perf_counter() - t
        t = time.perf_counter()
        for r in range(run.repeats):
            logits = forward(r)
        phases["timed"] = time.perf_counter() - t
        t = time.perf_counter()
        _complete(record, {"profiler": "cpu", "logits": logits, "samples": samples, "builds": [],
                           "timings": _timings_from_samples(samples, conv_names), "environment": environment()}, ctx)
        record["phases_s"] = {**phases, "check": time.perf_counter() - t}
        finish(record, time.perf_counter() - started)


def build_requests(network, variants: dict[str, Variant], run: RunSpec) -> list[BuildRequest]:
    """Every module a setting loads: layers.cu, and each conv layer's variant with its macros
    (tunables, and the layer's shape for variants that compile it in)."""
    requests = [BuildRequest.of(LAYERS_SOURCE, "layers", {"CONV_T": "double"} if network.dtype == "float64" else {})]
    for layer in network.conv_layers:
        variant = variants[layer.name]
        params = variant.resolve_params(run.params.get(layer.name), f"params.{layer.name}")
        requests.append(BuildRequest.of(variant.source, variant.name,
                                        variant.defines(params, network.variant_shape(layer, variant.fuses))))
    return list(dict.fromkeys(requests))


def _compile_errors(ctx: JobContext, todo: list[int], builds: dict) -> dict[int, str]:
    """setting index -> its first build's compile error, for the settings with one."""
    errors = {}
    for i in todo:
        for request in build_requests(ctx.batch.network, ctx.variants, ctx.runs[i]):
            if isinstance(builds.get(request), CompileError):
                errors[i] = str(builds[request])
                break
    return errors


def _measure_gpu_settings(ctx: JobContext, todo: list[int], backend: Backend, shared: dict, finish) -> None:
    spec = ctx.spec
    chunks = pass_chunks(spec.batch, spec.streams, spec.chunk_images)
    # The builds compile on the CPU cores while this thread opens the GPU (for NVML's idea of its
    # architecture: no CUDA context is needed to know it; sm_90 where there is no GPU, so that a
    # kernel that does not compile says so on any machine).
    arch = spec.arch if spec.arch != "auto" else host_gpu_arch() or "sm_90"
    requests = [r for i in todo for r in build_requests(ctx.batch.network, ctx.variants, ctx.runs[i])]
    with ExitStack() as stack:
        t = time.perf_counter()
        compiling = stack.enter_context(backend.compile_all(requests, arch))
        try:
            gpu = stack.enter_context(backend.gpu())
        except Exception:
            ctx.compile_errors = _compile_errors(ctx, todo, compiling.wait())
            raise
        # Everything this job does on the GPU, uploads included, happens under the GPU's lock.
        waiting = time.perf_counter()
        stack.enter_context(gpu_lock(gpu.uuid, f"job {spec.job_id} ({spec.experiment})"))
        shared["gpu_wait"] = time.perf_counter() - waiting
        monitor = stack.enter_context(GpuMonitor(gpu.uuid, gpu.pci_bus_id))
        env = environment(gpu)
        shared["context"] = time.perf_counter() - t - shared["gpu_wait"]
        t = time.perf_counter()
        compiling.wait()
        shared["compile"] = time.perf_counter() - t  # what compiling took beyond opening the GPU
        t = time.perf_counter()
        streams = [gpu.stream() for _ in range(spec.streams)]
        buffers = pipeline_buffers(gpu, ctx.batch.network, ctx.batch.images, spec.host_memory, streams[0])
        shared["allocate"] = time.perf_counter() - t
        # Where NVML could not tell (GPUs of several kinds), each op compiles for this GPU itself.
        session = GpuSession(gpu, streams, buffers, monitor, chunks, backend, arch if spec.arch != "auto" else gpu.arch)
        for n, i in enumerate(todo):
            started, record = time.perf_counter(), ctx.skeleton(i)
            try:
                with nvtx_range(f"setting {i}"), gpu.scope():
                    measured = _measure_gpu_setting(session, ctx, i)
                t = time.perf_counter()
                _complete(record, measured, ctx)
                record["phases_s"]["check"] = time.perf_counter() - t
            except Exception as e:  # this setting's failure (compile, launch, shape): the others go on
                record.update(status="failed", error=failure_message(e))
            record["environment"] = env
            finish(record, time.perf_counter() - started)
            print(f"[{n + 1}/{len(todo)}] {_describe(record)}", flush=True)


def _measure_gpu_setting(session: GpuSession, ctx: JobContext, index: int) -> dict:
    """One setting: its network (compiled builds loaded, weights, lanes), warm-up and timed passes."""
    gpu, streams, buffers, chunks = session.gpu, session.streams, session.buffers, session.chunks
    run, network = ctx.runs[index], ctx.batch.network
    conv_names = [layer.name for layer in network.conv_layers]
    phases, samples = {}, []
    t = time.perf_counter()
    plan = ConvPlan(ctx.variants, {layer: var.resolve_params(run.params.get(layer), f"params.{layer}")
                                   for layer, var in ctx.variants.items()}, session.arch)
    net = session.backend.network(gpu, network, ctx.batch.weights, plan, len(streams), max(hi - lo for lo, hi in chunks))
    poison_logits(gpu, buffers, streams[0])  # so a setting that writes nothing cannot pass with the last one's logits
    phases["setup"] = time.perf_counter() - t

    def forward(tag: str, repeat: int | None):
        with nvtx_range(tag):
            marks = {}
            start, h2d_end, d2h_start, end = pipeline_pass(gpu, net, streams, chunks, buffers, marks)
            end.sync()
            if repeat is None:
                return

            def add(metric, layer, value):
                samples.append({"metric": metric, "layer": layer, "repeat": repeat, "value": value})

            add("forward_ms", None, end - start)
            if len(chunks) == 1:  # with several chunks the copies of one interleave with others' kernels
                add("h2d_ms", None, h2d_end - start)
                add("compute_ms", None, d2h_start - h2d_end)
                add("d2h_ms", None, end - d2h_start)
            if len(streams) == 1:  # with several streams, event intervals include other streams' work
                for name in conv_names:
                    add("op_time_ms", name, sum(e - b for b, e in marks[name]))

    t = time.perf_counter()
    for w in range(run.warmup):
        forward(f"warmup {w}", None)
    phases["warmup"] = time.perf_counter() - t
    clocks = session.monitor.clocks()  # at the start of the timed part
    t = time.perf_counter()
    for r in range(run.repeats):
        forward(f"repeat {r}", r)
    phases["timed"] = time.perf_counter() - t
    return {"profiler": "events", "logits": np.array(buffers.logits_host, copy=True), "samples": samples,
            "builds": [b.record() for b in net.builds], "timings": _timings_from_samples(samples, conv_names),
            "clocks": clocks, "phases_s": phases}


def _describe(record: dict) -> str:
    """One progress line: the setting's tunables, status and op times."""
    ops = ", ".join(f"{layer} {ms:.3f} ms" for layer, ms in record["timings"]["op_time_ms"].items() if ms is not None)
    return " ".join(part for part in (tunables_text(record["spec"]["params"]), record["status"], ops,
                                      f"- {record['error']}" if record["error"] else "") if part)


def measure(run: RunSpec, keep_logits: bool = False, backend: Backend = Backend()) -> dict:
    """One setting measured in this process with CUDA events (or the CPU clock), as a lone job would;
    `keep_logits` leaves the output array in the measurement (result files never hold it)."""
    ctx = JobContext.open(JobSpec.for_run(run))
    ctx.keep_logits = keep_logits
    measured: list[dict] = []
    measure_settings(ctx, [0], backend, measured.append)
    return measured[0]


# -- resuming -----------------------------------------------------------------------------------
class ResumeStore:
    """The finished settings of a job whose result file is not written yet: `<job>.partial/`, one
    file per setting, each under the key of what it was measured from (the job, its kernels and
    their registry entries, the network and weights files). A run of the job measures only the
    settings without a stored measurement under the current key; writing the result file ends it."""

    def __init__(self, out_path: Path, key: str):
        self.dir = out_path.with_name(out_path.stem + ".partial")
        self.key = key

    def load(self) -> dict[str, dict]:
        """run_key -> measurement of this key; files of another key (older code) are removed."""
        found = {}
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                saved = {}
            if saved.get("resume_key") == self.key and isinstance(saved.get("measurement"), dict):
                found[saved["measurement"]["run_key"]] = saved["measurement"]
            else:
                path.unlink(missing_ok=True)
        return found

    def put(self, measurement: dict) -> None:
        write_json_atomic(self.dir / f"{measurement['run_key']}.json", {"resume_key": self.key, "measurement": measurement})

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def resume_key(ctx: JobContext) -> str:
    """What a stored setting must have been measured from to count as measured: the job, its
    kernel sources, its variants' registry entries, and the network and weights files."""
    files = [p for p in (ctx.network.path, ctx.network.weights_path) if p is not None]
    return canonical_hash({"job": ctx.spec.job_key, "sources": ctx.provenance["sources"],
                           "registry": {v.name: v.entry_hash for v in ctx.variants.values()},
                           "files": {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in files}})


# -- the job ------------------------------------------------------------------------------------
def run_job(spec: JobSpec, out_path: Path, process_age: float | None = None, backend: Backend = Backend()) -> dict:
    """Measure the job's settings and write its result file; returns what it wrote. A setting's
    failure is stored, never raised; a spec whose settings cannot be worked out raises ConvsweepError.

    `process_age` is how long the process had run before this call (cli.process_age()): the
    phase process_start, counted into the job's total_s.
    """
    out_path = Path(out_path)
    started, started_at = time.perf_counter(), _now()
    remove_stale_temporaries(out_path)
    ctx = JobContext.open(spec)
    resume = ResumeStore(out_path, resume_key(ctx))
    stored = resume.load()
    todo = [i for i, run in enumerate(ctx.runs) if run.run_key not in stored]
    print(f"{spec.job_id}: {len(ctx.runs)} of {ctx.settings.valid} valid settings"
          + (f", {len(ctx.runs) - len(todo)} of them measured before" if len(todo) < len(ctx.runs) else ""), flush=True)
    fresh: list[dict] = []

    def keep(measurement: dict) -> None:
        resume.put(measurement)
        fresh.append(measurement)

    shared: dict = {}
    files: dict = {}
    if todo:
        nsys_path = nsys_mod.find_nsys() if spec.profiler == "nsys" else None
        if nsys_path and not all(v.is_cpu for v in ctx.variants.values()):
            shared, files = _measure_under_nsys(ctx, todo, out_path, nsys_path, keep)
        else:
            shared = measure_settings(ctx, todo, backend, keep)
            if spec.profiler == "nsys":
                for m in fresh:
                    m["profiler_note"] = "nsys not found: timed with CUDA events"
    shared = {"process_start": process_age, **shared} if process_age is not None else shared
    wall = (process_age or 0.0) + time.perf_counter() - started
    _share_job_time(fresh, shared, wall)
    by_key = {**stored, **{m["run_key"]: m for m in fresh}}
    result = {"format": FORMAT, "job_id": spec.job_id, "job_key": spec.job_key, "job": spec.to_dict(),
              "sweep": spec.sweep, "settings": {"valid": ctx.settings.valid, "measured": len(fresh),
                                                "resumed": len(ctx.runs) - len(todo)},
              "started_at": started_at, "total_s": wall, "phases_s": {k: finite(v) for k, v in shared.items()},
              "files": files, "measurements": [by_key[run.run_key] for run in ctx.runs]}
    write_json_atomic(out_path, result)
    resume.clear()
    return result


def _share_job_time(fresh: list[dict], shared: dict, wall: float) -> None:
    """Give each setting measured now an equal share of what the job spent on all of them (process
    start, loading, the GPU context, compiling, nsys): its phases gain the shared phases over n, and
    its total_s is its own time plus 1/n of the rest, so a job's settings add up to its wall time."""
    if not fresh:
        return
    n = len(fresh)
    rest = max(0.0, wall - sum(m["timings"]["total_s"] or 0.0 for m in fresh))
    for m in fresh:
        m["phases_s"] = {k: finite(v) for k, v in {**{k: v / n for k, v in shared.items() if v is not None},
                                                    **m["phases_s"]}.items()}
        m["timings"]["total_s"] = (m["timings"]["total_s"] or 0.0) + rest / n


# -- under nsys ---------------------------------------------------------------------------------
def _measure_under_nsys(ctx: JobContext, todo: list[int], out_path: Path, nsys_path: str,
                        keep: Callable[[dict], None]) -> tuple[dict, dict]:
    """Measure `todo` in a child process under one `nsys profile`, then give each setting the
    kernel and copy records of its NVTX range. A setting the child never finished (it crashed)
    is stored as failed; nsys failing fails every setting with its message."""
    report_base = out_path.with_suffix("")
    spec = ctx.spec
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, progress = Path(tmp) / "job.json", Path(tmp) / "measured.jsonl"
        spec_file.write_text(json.dumps({"job": {**spec.to_dict(), "sweep": spec.sweep}, "settings": todo}))
        t = time.perf_counter()
        try:
            sqlite_path = nsys_mod.profile([sys.executable, "-m", "convsweep.cli", "measure", "--spec-file",
                                            str(spec_file), "--out", str(progress)], report_base, nsys_path, log=None)
            problem = None
        except ConvsweepError as e:
            sqlite_path, problem = None, str(e)
        wall = time.perf_counter() - t
        lines = _read_progress(progress)
    inner_shared = next((line["shared"] for line in lines if "shared" in line), {})
    measured = {m["grid"]["index"]: m for line in lines if (m := line.get("measurement"))}
    summaries = {}
    if sqlite_path is not None:
        conv_names = list(spec.variants)
        activities = nsys_mod.read_activities(sqlite_path, {layer.name for layer in ctx.network.layers})
        summaries = nsys_mod.summarize_settings(activities, conv_names)
    files = {"nsys_report": str(report_base.with_suffix(".nsys-rep")), "nsys_sqlite": str(sqlite_path)} \
        if sqlite_path is not None else {}
    for i in todo:
        m = measured.get(i)
        if m is None:
            m = ctx.skeleton(i)
            m.update(error=problem or "the measuring process ended before this setting (it crashed: see the job log)",
                     environment=environment())
            m["timings"]["total_s"] = 0.0
        elif m["status"] != "failed":
            _apply_nsys(m, summaries.get(i), problem, spec.repeats)
        m["files"] = files
        keep(m)
    own = sum(v for v in inner_shared.values() if v) + sum(m["timings"]["total_s"] or 0 for m in measured.values())
    return {**inner_shared, "profile": max(0.0, wall - own)}, files


def _apply_nsys(m: dict, summary: dict | None, problem: str | None, repeats: int) -> None:
    """Replace a setting's event timings with its nsys records; keep the event forward pass beside them."""
    seen = summary["repeats_seen"] if summary else 0
    if problem or seen != repeats:
        m.update(status="failed", error=problem or f"nsys report holds {seen} timed repeats of this setting, "
                                                    f"expected {repeats}")
        return
    timings = m["timings"]
    event_forward = timings.get("forward_ms")
    timings.update({k: finite(summary[k]) for k in ("h2d_ms", "d2h_ms", "compute_ms", "forward_ms", "overlap",
                                                     "streams_used")})
    timings["op_time_ms"] = {k: finite(v) for k, v in summary["op_time_ms"].items()}
    timings["event_forward_ms"] = event_forward
    m.update(profiler="nsys", samples=summary["samples"], kernels=summary["kernels"], memcpys=summary["memcpys"])


def _read_progress(path: Path) -> list[dict]:
    """The child's lines: one per finished setting, then its shared phases; a line cut short by a
    crash is left out."""
    lines = []
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


def measure_to_file(spec: JobSpec, todo: list[int], out_path: Path) -> None:
    """The child half of a job under nsys: measure, appending each finished setting to `out_path`
    (one JSON line, flushed) and last the phases the settings shared."""
    with open(out_path, "a") as out:
        def write(line: dict) -> None:
            out.write(json.dumps(line) + "\n")
            out.flush()

        shared = measure_settings(JobContext.open(spec), todo, Backend(), lambda m: write({"measurement": m}))
        write({"shared": shared})
