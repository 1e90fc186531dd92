"""Measuring a job's settings in this process: the CPU reference with the host clock, or the GPU
with CUDA events.

`measure_settings` is the body of every job: it loads the batch and its float64 reference once,
opens the GPU once while the settings' builds compile on the CPU cores (through the disk cache),
then measures the settings one after another, each inside NVTX range "setting <i>" with buffers
of its own: warm-up, timed repeats, check against float64. job.py decides where this runs (this
process, or a child under nsys) and what becomes of the measurements.

Where the line between a result and the machine lies: a GPU that cannot be opened (no driver, no
device) raises MachineError, and so does a disk that cannot take a finished setting (on_measured's
write); both leave the job without a result. Once the GPU is open, whatever fails is the setting's
result (failed, with the message), even a GPU that falls off the bus mid-job: CUDA reports it as it
reports a kernel's illegal access, and the two cannot be told apart here.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from convsweep.model.checks import Check, check_logits
from convsweep.device.compile import LAYERS_SOURCE, BuildRequest
from convsweep.sweep.config import JobSpec, RunSpec, tunables_text
from .context import JobContext
from convsweep.base.heartbeat import GPU_KEYS, beat
from convsweep.base.errors import CompileError, ConvsweepError, MachineError, failure_message
from convsweep.device.gpulock import bind_free_gpu, gpu_lock, holds_lock_of
from convsweep.inputs.batch import load_batch
from .integrity import IntegrityObserver, Rounds, judge_floors, open_rounds, settle
from convsweep.model.network import reference_layer
from convsweep.base.numbers import finite, median
from convsweep.base.progress import progress
from convsweep.device.provenance import NO_GPU_ARCH, GpuMonitor, environment, host_environment, host_gpu_arch
from .record import Measurement, Sample, Stopping, Timings
from .runner import Backend, ConvPlan, PipelineBuffers, nvtx_range, pass_chunks, pipeline_buffers, pipeline_pass, poison_logits
from convsweep.sweep.search import Search, UpFront, objective, proposals
from convsweep.base.stats import StoppingRule
from .timing import FLUSH, EnergyObserver, HostClock, L2FlushObserver, Reading, pipeline_timer, sample
from convsweep.model.variants import Variant

if TYPE_CHECKING:
    from convsweep.device.gpu import Gpu


def _timings_from_samples(samples: list[Sample], conv_names: list[str], compile_ms: float | None = None) -> Timings:
    def med(metric, layer=None):
        return finite(median(s.value for s in samples if s.metric == metric and s.layer == layer))

    return Timings(op_time_ms={name: med("op_time_ms", name) for name in conv_names},
                   h2d_ms=med("h2d_ms"), d2h_ms=med("d2h_ms"), compute_ms=med("compute_ms"),
                   forward_ms=med("forward_ms"), overlap=med("overlap"), streams_used=med("streams_used"),
                   compile_ms=compile_ms)


def _floor_shape(network, name: str, variant: Variant, batch: int):
    """The problem a timed layer's floor is reckoned on: what its kernel computes and writes, the conv and
    the layers it fuses (a relu and max-pool: the pooled maps are its output; a fused network's whole run,
    whose intermediate maps need not leave the chip), read from what was shipped where it absorbs the
    network's first layer. (Reckoned on the conv alone, a pool-fusing kernel's floor counted the unpooled
    maps it never writes: on the lent H100, tf32_sliding_window's conv1 at batch 10000 took 0.35 ms
    against a 0.378 ms floor and was wrongly suspect.)"""
    fused = network.fused_layers(name, variant.fuses)
    return network.conv_shape(network.layer(name), batch, fused, network.absorbed_input(name, variant.absorbs_input))


def _complete(record: Measurement, logits: np.ndarray, ctx: JobContext, check: Check | None = None) -> None:
    """A measured setting's verdict on round 0 (`check`: the GPU's, against its float64 truth; else the host's
    reference here), its tolerance, images and floors."""
    assert ctx.batch is not None and record.grid is not None  # loaded by measure_settings; set by ctx.measurement
    batch, run = ctx.batch, ctx.runs[record.grid.index]
    if check is None:
        check = check_logits(logits, batch.reference, batch.dataset.labels, batch.idx, ctx.variants.values())
    record.status, record.error, record.max_rel_err = check.status, check.error, check.max_rel_err
    record.accuracy, record.prediction_agreement = check.accuracy, check.prediction_agreement
    record.tolerance = max(v.tolerance for v in ctx.variants.values())
    record.images = {"batch": run.batch, "unique": len(batch.dataset.images),
                     "cycled": run.batch > len(batch.dataset.images),
                     "input_bytes": int(batch.images.nbytes),  # what crosses the bus a pass, in the input's format
                     "logits_bytes": int(logits.nbytes),
                     "tail_images": min(hi - lo for lo, hi in pass_chunks(run.batch, run.streams, run.chunk_images))}
    record.floors = {name: {"bytes": s.min_bytes, "flops": s.flops, "unit": ctx.variants[name].unit} for name in ctx.variants
                     for s in [_floor_shape(batch.network, name, ctx.variants[name], run.batch)]}
    if ctx.keep_logits:
        record.logits = logits


@dataclass
class GpuSession:
    """The GPU side every setting of a job shares: device, streams, the batch's host and device
    buffers, the NVML monitor, the chunking of a pass, and the backend that builds networks (and
    whose clock times the passes on the host). `gpu_session` opens one and owns all it holds."""

    gpu: Gpu
    streams: list
    buffers: PipelineBuffers
    monitor: GpuMonitor
    chunks: list[tuple[int, int]]
    backend: Backend
    arch: str  # what the builds target
    environment: dict  # the machine's, read with the GPU open (convsweep.device.provenance)
    rounds: Rounds | None = None  # a job's rounds of inputs on the host (convsweep.measure.integrity)
    peaks: dict | None = None  # the device's peak rates (convsweep.device.peaks), what a job's floors are held to


@contextmanager
def gpu_session(spec: JobSpec, batch, backend: Backend, holder: str, streams: int,
                phases: dict[str, float] | None = None) -> Iterator[GpuSession]:
    """The GPU for `spec`'s batch, open for the block: its lock held (in `holder`'s name), a CUDA context, NVML's
    monitor, `streams` streams and the pipeline's buffers with the images in them; all of it released, the lock
    last, when the block ends. The seconds of its steps go into `phases` (gpu_wait, context, allocate). A GPU
    that cannot be opened (no driver, no device) raises MachineError: nothing else here raises it."""
    clock, phases = backend.clock, {} if phases is None else phases
    with ExitStack() as stack:
        # The GPU's lock before this process opens a CUDA context: another process's context slows
        # the kernels being timed (on the lent H100, each context opened beside a timed job slowed
        # about nine of its passes, up to twice as long; a driver start or NVML read did not: see
        # docs/throughput.md). The lock is let go after the GPU is closed.
        t = clock()
        stack.enter_context(bind_free_gpu(holder))
        phases["gpu_wait"] = clock() - t
        t = clock()
        fallback = stack.enter_context(ExitStack())  # exits after the GPU closes: a lock taken below outlives it
        gpu = stack.enter_context(backend.gpu())
        if not holds_lock_of(gpu.uuid):  # NVML could not say which GPU CUDA would open: lock the one it did
            fallback.enter_context(gpu_lock(gpu.uuid, holder))
        monitor = stack.enter_context(backend.monitor(gpu.uuid, gpu.pci_bus_id))
        env = environment(gpu, monitor)  # NVML opened once: each opening is ~0.03 s of the lock's time
        beat("gpu", json.dumps({key: env[key] for key in GPU_KEYS}))  # what a setting the watcher kills ran on
        phases["context"] = clock() - t
        t = clock()
        lanes = [gpu.stream() for _ in range(streams)]
        buffers = pipeline_buffers(gpu, batch.network, batch.images, spec.host_memory, lanes[0])
        phases["allocate"] = clock() - t
        # Where NVML could not tell (GPUs of several kinds), each op compiles for this GPU itself.
        yield GpuSession(gpu, lanes, buffers, monitor, pass_chunks(spec.batch, streams, spec.chunk_images), backend,
                         spec.arch if spec.arch != "auto" else gpu.arch, env)


def measure_settings(ctx: JobContext, todo: list[int], backend: Backend = Backend(),
                     on_measured: Callable[[Measurement], None] = lambda m: None,
                     told: Sequence[tuple[int, dict[str, float] | None]] = ()) -> dict:
    """Measure settings `todo` (indices into ctx.runs) in this process, all of them or, for a guided search,
    those it proposes among them (`told`: what a resumed job measured before, in the order proposed); each
    finished measurement goes to `on_measured` as it is made. Returns the seconds of the phases they shared.
    A failure before any setting could run (data, a spec it cannot run) is every remaining setting's failure
    (a guided search's next proposals'); the machine's (MachineError: no GPU, no disk) is raised, with what
    was measured already handed on."""
    shared: dict[str, float] = {}
    done: set[int] = set()
    asked = proposals([run.params for run in ctx.runs], ctx.spec.search, todo, told,
                      groups=[entry["layers"] for entry in ctx.spec.grid])

    def finish(record: Measurement, own_s: float) -> None:
        assert record.timings is not None and record.grid is not None  # ctx.measurement sets both
        record.timings.total_s = own_s  # its own time; run_job adds its share of the job's
        if (proposal := asked.proposal_of(record.grid.index)) is not None:
            record.grid.proposal = proposal
        done.add(record.grid.index)
        on_measured(record)
        asked.tell(record.grid.index, objective(record.status, record.timings.op_time_ms))

    try:
        t = time.perf_counter()
        ctx.batch = load_batch(ctx.network, ctx.spec.dataset, ctx.spec.batch, ctx.spec.input_format)
        _ = ctx.batch.images
        shared["load"] = time.perf_counter() - t
        cpu = {v.is_cpu for v in ctx.variants.values()}
        if cpu == {True}:
            t = time.perf_counter()
            _ = ctx.batch.reference  # from the disk cache, or computed once for every setting
            shared["reference"] = time.perf_counter() - t
            _measure_cpu_settings(ctx, asked, finish)
        elif cpu == {False}:
            _measure_gpu_settings(ctx, asked, backend, shared, finish)
        else:
            raise ConvsweepError("a job cannot mix the CPU 'reference' variant with GPU variants")
    except MachineError:
        raise
    except Exception as e:  # the job's own failure: every setting not yet measured is stored with it
        message, env = failure_message(e), environment()
        unfinished = [i for i in asked.proposed if i not in done] or asked.propose()
        for i in unfinished:
            record = ctx.measurement(i)
            record.error, record.environment = message, env
            finish(record, 0.0)
    return shared


def _measure_cpu_settings(ctx: JobContext, asked: Search | UpFront, finish) -> None:
    """The CPU reference: synchronous numpy, so a host clock around each layer is an honest timer."""
    assert ctx.batch is not None  # loaded by measure_settings
    network = ctx.batch.network
    conv_names = list(ctx.variants)  # the timed layers: a fused network's conv1 times the later convs too
    dtype = np.dtype(network.dtype)
    cast = {k: v.astype(dtype) for k, v in ctx.batch.weights.items()}
    images = ctx.batch.images.astype(dtype)
    timer = HostClock()
    while batch := asked.propose():
        for i in batch:
            _measure_cpu_setting(ctx, i, network, conv_names, cast, images, timer, finish)


def _measure_cpu_setting(ctx: JobContext, i: int, network, conv_names: list[str], cast: dict, images: np.ndarray,
                         timer: HostClock, finish) -> None:
    started, record, run, out = time.perf_counter(), ctx.measurement(i), ctx.runs[i], {}

    def one_pass(marks: dict) -> None:
        x = images
        for layer in network.layers:
            t = timer.clock()
            x = reference_layer(layer, cast, x)
            marks[layer.name] = [(t, timer.clock())]
        out["logits"] = x

    sampled = sample(timer, one_pass, StoppingRule.of(run.repeats, run.stopping), warmup=run.warmup)
    t = time.perf_counter()
    samples = [s for n, reading in enumerate(sampled.readings) for s in
               [*(Sample("op_time_ms", name, n, reading.marked_ms(name)) for name in conv_names),
                Sample("forward_ms", None, n, reading.ms)]]
    record.profiler, record.samples, record.builds = "cpu", samples, []
    record.timings = _timings_from_samples(samples, conv_names)
    record.environment, record.stopping = environment(), Stopping.from_json(sampled.stopping)
    _complete(record, out["logits"], ctx)
    record.phases_s = {"warmup": sampled.warmup_s, "timed": sampled.timed_s, "check": time.perf_counter() - t}
    finish(record, time.perf_counter() - started)


def build_requests(network, variants: dict[str, Variant], run: RunSpec) -> list[BuildRequest]:
    """Every module a setting loads: layers.cu, and each conv layer's variant with its macros
    (tunables, and the layer's shape for variants that compile it in)."""
    requests = [BuildRequest.of(LAYERS_SOURCE, "layers", {"CONV_T": "double"} if network.dtype == "float64" else {})]
    for name, variant in variants.items():
        params = variant.resolve_params(run.params.get(name), f"params.{name}")
        requests.append(BuildRequest.of(cast(Path, variant.source), variant.name,  # a GPU variant's: it has one
                                        variant.defines(params, network.variant_shape(network.layer(name), variant.fuses,
                                                                                      absorbs=variant.absorbs_input))))
    return list(dict.fromkeys(requests))


def _compile_errors(ctx: JobContext, todo: list[int], builds: dict) -> dict[int, str]:
    """setting index -> its first build's compile error, for the settings with one."""
    assert ctx.batch is not None  # loaded by measure_settings
    errors = {}
    for i in todo:
        for request in build_requests(ctx.batch.network, ctx.variants, ctx.runs[i]):
            if isinstance(builds.get(request), CompileError):
                errors[i] = str(builds[request])
                break
    return errors


def _build_arch(spec: JobSpec) -> str:
    """What a job's kernels are compiled for before any CUDA context: the spec's, or NVML's idea of this GPU's
    (the lent H100's where there is none, so that a kernel that does not compile says so on any machine)."""
    return spec.arch if spec.arch != "auto" else host_gpu_arch() or NO_GPU_ARCH


def _measure_gpu_settings(ctx: JobContext, asked: Search | UpFront, backend: Backend, shared: dict, finish) -> None:
    assert ctx.batch is not None  # loaded by measure_settings
    spec, clock = ctx.spec, backend.clock
    # The builds compile on the CPU cores (for NVML's idea of the GPU's architecture: no CUDA context
    # is needed to know it; the lent H100's where there is no GPU, so that a kernel that does not compile says
    # so on any machine), while other jobs may hold the GPU. A guided search's first proposals alone are
    # known now: each later round of them compiles in parallel before it is measured.
    arch = _build_arch(spec)
    todo = asked.propose()
    requests = [r for i in todo for r in build_requests(ctx.batch.network, ctx.variants, ctx.runs[i])]
    with ExitStack() as stack:
        t = clock()
        beat("compile")
        builds = stack.enter_context(backend.compile_all(requests, arch)).wait()
        beat("compiled")
        host_environment()  # read now (counted here): what a job does while it holds the GPU, others wait for
        shared["compile"] = clock() - t
        holder = f"job {spec.job_id} ({spec.experiment})"
        try:
            session = stack.enter_context(gpu_session(spec, ctx.batch, backend, holder, spec.streams, shared))
        except MachineError:  # the GPU could not be opened
            # A kernel that does not compile is a result on any machine (the builds ran on the CPU):
            # those settings are stored; the job is the machine's failure only if any other remains.
            failed = _compile_errors(ctx, todo, builds)
            env = environment() if failed else None
            for i, error in failed.items():
                record = ctx.measurement(i)
                record.error, record.environment = error, env
                finish(record, 0.0)
            if len(failed) < len(todo):
                raise
            return
        t = clock()
        # The truth's module and weights, round 0's truth (held to the host's on a sample), the job's seed.
        rounds = open_rounds(session.gpu, session.arch, ctx.batch, session.buffers, spec.host_memory,
                             session.streams[0])
        shared["reference"] = clock() - t
        session = replace(session, rounds=rounds, peaks=_peaks(backend, session.gpu, session.monitor))
        bar = progress(total=asked.budget, desc=f"job {spec.job_id}", unit="setting", enabled=asked.budget > 1)
        measured = 0
        while todo:
            for i in todo:
                record = _measure_one(session, ctx, i, finish)
                measured += 1
                bar.update(1)
                # The job log's line; on a terminal, drawn above the bar rather than through it.
                bar.write(f"[{measured}/{asked.budget}] {_describe(record)}", file=sys.stdout)
                sys.stdout.flush()
            if todo := asked.propose():  # a guided search's next round, compiled in parallel first
                t = clock()
                requests = [r for i in todo for r in build_requests(ctx.batch.network, ctx.variants, ctx.runs[i])]
                beat("compile")
                with backend.compile_all(requests, session.arch) as pending:
                    pending.wait()
                beat("compiled")
                shared["compile"] += clock() - t
        bar.close()


def _measure_one(session: GpuSession, ctx: JobContext, i: int, finish) -> Measurement:
    """Setting i, measured, checked and handed to `finish`; a failure of its own (compile, launch, shape) is
    its result, and the job goes on."""
    clock = session.backend.clock
    started, record = clock(), ctx.measurement(i)
    beat("setting", i)  # from here, each pass is held to the job's deadline (convsweep.measure.deadline)
    try:
        with nvtx_range(f"setting {i}"), session.gpu.scope():
            logits, guard = _measure_gpu_setting(session, ctx, record)
        t = clock()
        _complete(record, logits, ctx, guard.seed)
        guard.apply(record)  # a wrong timed pass, and what else the checks found
        # The integrity found (apply), the job's rounds (_measure_gpu_settings) and the phases (_measure_gpu_setting).
        assert record.integrity is not None and session.rounds is not None and record.phases_s is not None
        assert ctx.batch is not None
        record.integrity.inputs = session.rounds.maker.record()
        record.integrity.peaks = session.peaks
        judge_floors(record, ctx.batch.network)
        settle(record)
        record.phases_s["check"] = clock() - t
        if ctx.spec.sanitize and record.status in ("ok", "suspect"):
            beat("wait")  # compute-sanitizer's own limit (convsweep.sweep.sanitize), not a pass's
            t = clock()
            _sanitized(record, ctx.runs[i])
            record.phases_s["sanitize"] = clock() - t
    except Exception as e:
        record.status, record.error = "failed", failure_message(e)
    record.environment = session.environment
    beat("wait")  # what follows a setting (the next one's set-up, the result file) is no kernel's
    finish(record, clock() - started)
    return record


def _sanitized(record: Measurement, run: RunSpec) -> None:
    """`sanitize: true`: one checked pass of the setting again under compute-sanitizer (convsweep.sweep.sanitize), in a
    child that shares this job's hold on the GPU; an error it finds is the setting's verdict."""
    from convsweep.sweep.sanitize import sanitize, verdict

    assert record.integrity is not None  # the checks' findings (IntegrityObserver.apply) before this
    record.integrity.sanitizer = sanitize(run)
    error = verdict(record.integrity.sanitizer)
    if error is not None:
        record.status, record.error = "incorrect", error


def _peaks(backend: Backend, gpu, monitor) -> dict | None:
    """The device's peak rates, or None where its attributes cannot tell them (no floors are held then)."""
    try:
        return backend.peaks(gpu, monitor)
    except Exception as e:  # an attribute a driver lacks: the floors are unknown, not the job failed
        print(f"peak rates unknown ({failure_message(e)}): times are not held to floors", file=sys.stderr)
        return None


def _measure_gpu_setting(session: GpuSession, ctx: JobContext, record: Measurement
                         ) -> tuple[np.ndarray, IntegrityObserver]:
    """One setting: its network (compiled builds loaded, weights, lanes), the device's state reset,
    a checked pass over the seeds' batch, warm-up and timed passes, each pass between CUDA events on
    the first stream, checked and watched by the backend's observers. What they measured goes into
    `record` once the passes are done; returns the seed pass's logits (the run's accuracy) and what
    the integrity checks found."""
    assert ctx.batch is not None and record.grid is not None and session.rounds is not None  # _measure_gpu_settings'
    gpu, streams, buffers, chunks = session.gpu, session.streams, session.buffers, session.chunks
    run, network, backend = ctx.runs[record.grid.index], ctx.batch.network, session.backend
    conv_names = list(ctx.variants)  # the timed layers: a fused network's conv1 times the later convs too
    t = backend.clock()
    plan = ConvPlan(ctx.variants, {layer: var.resolve_params(run.params.get(layer), f"params.{layer}")
                                   for layer, var in ctx.variants.items()}, session.arch)
    net = backend.network(gpu, network, ctx.batch.weights, plan, len(streams), max(hi - lo for lo, hi in chunks))
    poison_logits(gpu, buffers, streams[0])  # so a setting that writes nothing cannot pass with the last one's logits
    phases: dict[str, float | None] = {"setup": backend.clock() - t}
    observers = backend.observers(gpu, session.monitor, run, backend.clock)
    flush = next((o.before_layer for o in observers if isinstance(o, L2FlushObserver)), None)

    rounds = session.rounds

    def one_pass(marks: dict):
        start, h2d_end, d2h_start, end = pipeline_pass(gpu, net, streams, chunks, rounds.buffers(), marks, flush)
        marks.update(h2d=[(start, h2d_end)], compute=[(h2d_end, d2h_start)], d2h=[(d2h_start, end)])
        return start, end

    # timer (convsweep.base.axes): each pass's own events, or one replay of each host buffer's pass captured once, timed whole.
    events = run.timer == "events"
    timer = pipeline_timer(gpu, streams[0], graph=not events, key=rounds.key)

    def timed_pass() -> Reading:  # one more pass, for the caching test: not a repeat to nsys
        with nvtx_range("caching test"):
            reading = timer.time(one_pass)
        _ = reading.ms  # waits for it
        return reading

    def pass_ms(reading: Reading) -> float:
        """What a kernel's caching would shorten: its layers' events where a pass has them, else the pass."""
        layers = sum(reading.marked_ms(name) for name in conv_names) if events and len(streams) == 1 else 0.0
        return layers or reading.ms

    guard = IntegrityObserver(gpu, net, streams, chunks, rounds, ctx.variants, run.checks, timed_pass, pass_ms)
    guard.clean_device()
    t = backend.clock()
    with nvtx_range("seed"):  # the first warm-up pass, checked: the run's accuracy is this pass's
        guard.seed_pass(lambda: timer.warm(one_pass))
    phases["seed"] = backend.clock() - t
    sampled = sample(timer, one_pass, StoppingRule.of(run.repeats, run.stopping), [guard, *observers],
                     max(0, run.warmup - 1), backend.clock, nvtx_range)
    samples = []
    for n, reading in enumerate(sampled.readings):
        samples.append(Sample("forward_ms", None, n, reading.ms))  # a cold pass's L2 flushes left out
        if flush is not None:
            samples.append(Sample("l2_flush_ms", None, n, sampled.observed["l2_flush_ms"][n]))
        if not events:
            continue  # a replay has no events of its own inside
        if len(chunks) == 1:  # with several chunks the copies of one interleave with others' kernels
            samples += [Sample("h2d_ms", None, n, reading.marked_ms("h2d")),
                        Sample("compute_ms", None, n, reading.marked_ms("compute") - reading.marked_ms(FLUSH)),
                        Sample("d2h_ms", None, n, reading.marked_ms("d2h"))]
        if len(streams) == 1:  # with several streams, event intervals include other streams' work
            samples += [Sample("op_time_ms", name, n, reading.marked_ms(name)) for name in conv_names]
    phases.update(warmup=sampled.warmup_s, timed=sampled.timed_s)
    energy = next((o for o in observers if isinstance(o, EnergyObserver)), None)
    if energy is not None and energy.extra_s is not None:
        phases["energy"] = energy.extra_s
    compile_ms = sum(b.compile_ms for b in net.builds if not b.cache_hit) if net.builds else None  # cache misses
    # The record takes what the passes measured only once all of it is known: a failure before leaves it unmeasured.
    observed = sampled.observed
    record.profiler, record.samples, record.builds = "events", samples, [b.record() for b in net.builds]
    record.timings, record.stopping = _timings_from_samples(samples, conv_names, compile_ms), \
        Stopping.from_json(sampled.stopping)
    record.clocks, record.clocks_after = observed.get("clocks", record.clocks), observed.get("clocks_after")
    record.energy, record.throttle, record.note = observed.get("energy"), observed.get("throttle"), observed.get("note")
    record.phases_s = phases
    assert guard.seed_logits is not None  # the seed pass's
    return guard.seed_logits, guard


def _describe(record: Measurement) -> str:
    """One progress line: the setting's tunables, status and op times."""
    timings, params = record.timings, record.params
    assert timings is not None and timings.op_time_ms is not None and params is not None  # a job's (ctx.measurement)
    ops = ", ".join(f"{layer} {ms:.3f} ms" for layer, ms in timings.op_time_ms.items() if ms is not None)
    return " ".join(part for part in (tunables_text(params), record.status, ops,
                                      f"- {record.error}" if record.error else "") if part)


def measure(run: RunSpec, keep_logits: bool = False, backend: Backend = Backend()) -> Measurement:
    """One setting measured in this process with CUDA events (or the CPU clock), as a lone job would;
    `keep_logits` leaves the output array in the measurement (result files never hold it)."""
    ctx = JobContext.open(JobSpec.for_run(run))
    ctx.keep_logits = keep_logits
    measured: list[Measurement] = []
    measure_settings(ctx, [0], backend, measured.append)
    return measured[0]
