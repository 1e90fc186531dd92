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

import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np

from .checks import check_logits
from .compile import LAYERS_SOURCE, BuildRequest
from .config import JobSpec, RunSpec, tunables_text
from .errors import CompileError, ConvsweepError, MachineError, failure_message
from .gpulock import bind_free_gpu, gpu_lock, holds_lock_of
from .inputs import load_batch
from .job import JobContext
from .network import reference_layer
from .numbers import finite, median
from .progress import progress
from .provenance import GpuMonitor, environment, host_environment, host_gpu_arch, slowdown_names
from .runner import (FLUSH, Backend, ConvPlan, PipelineBuffers, nvtx_range, pass_chunks, pipeline_buffers,
                     pipeline_pass, poison_logits)
from .stats import StoppingRule
from .variants import Variant


def _timings_from_samples(samples: list[dict], conv_names: list[str]) -> dict:
    def med(metric, layer=None):
        return finite(median(s["value"] for s in samples if s["metric"] == metric and s["layer"] == layer))

    return {"op_time_ms": {name: med("op_time_ms", name) for name in conv_names},
            "h2d_ms": med("h2d_ms"), "d2h_ms": med("d2h_ms"), "compute_ms": med("compute_ms"),
            "forward_ms": med("forward_ms"), "overlap": med("overlap"), "streams_used": med("streams_used")}


def _floor_shape(network, name: str, variant: Variant, batch: int):
    """The problem a timed layer's floor is reckoned on: the conv alone, or for a fused network the
    whole run of layers its kernel computes (whose intermediate maps need not leave the chip)."""
    layer = network.layer(name)
    return network.variant_shape(layer, variant.fuses, batch) if variant.fuses_tail else network.conv_shape(layer, batch)


def _complete(record: dict, measured: dict, ctx: JobContext) -> None:
    """Fold one setting's measurement into its record and check its logits against float64."""
    batch, run = ctx.batch, ctx.runs[record["grid"]["index"]]
    logits = measured.pop("logits")
    check = check_logits(logits, batch.reference, batch.dataset.labels, batch.idx, ctx.variants.values())
    timings = measured.pop("timings")
    record.update(measured, **check.record(), tolerance=max(v.tolerance for v in ctx.variants.values()),
                  images={"batch": run.batch, "unique": len(batch.dataset.images),
                          "cycled": run.batch > len(batch.dataset.images)},
                  floors={name: {"bytes": s.min_bytes, "flops": s.flops} for name in ctx.variants
                          for s in [_floor_shape(batch.network, name, ctx.variants[name], run.batch)]})
    record["timings"].update(timings)
    missed = [b["compile_ms"] for b in record["builds"] if not b["cache_hit"]]
    record["timings"]["compile_ms"] = sum(missed) if record["builds"] else None
    if ctx.keep_logits:
        record["logits"] = logits


@dataclass
class GpuSession:
    """The GPU side every setting of a job shares: device, streams, the batch's host and device
    buffers, the NVML monitor, the chunking of a pass, and the backend that builds networks (and
    whose clock times the passes on the host)."""

    gpu: object
    streams: list
    buffers: PipelineBuffers
    monitor: GpuMonitor
    chunks: list[tuple[int, int]]
    backend: Backend
    arch: str  # what the builds target
    flush: Callable[[object], None] | None = None  # cache cold: writes over L2 on a stream (Gpu.l2_flusher)


def measure_settings(ctx: JobContext, todo: list[int], backend: Backend = Backend(),
                     on_measured: Callable[[dict], None] = lambda m: None) -> dict:
    """Measure settings `todo` (indices into ctx.runs) in this process; each finished measurement
    goes to `on_measured` as it is made. Returns the seconds of the phases they shared. A failure
    before any setting could run (data, a spec it cannot run) is every remaining setting's failure; the
    machine's (MachineError: no GPU, no disk) is raised, with what was measured already handed on."""
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
    except MachineError:
        raise
    except Exception as e:  # the job's own failure: every setting not yet measured is stored with it
        message, env = failure_message(e), environment()
        for i in todo:
            if i not in done:
                record = ctx.skeleton(i)
                record.update(error=message, environment=env)
                finish(record, 0.0)
    return shared


def _measure_cpu_settings(ctx: JobContext, todo: list[int], finish) -> None:
    """The CPU reference: synchronous numpy, so a host clock around each layer is an honest timer."""
    network, images = ctx.batch.network, ctx.batch.images
    conv_names = list(ctx.variants)  # the timed layers: a fused network's conv1 times the later convs too
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
        rule, stop = StoppingRule.of(run.repeats, run.stopping), None
        while stop is None:
            logits = forward(len(rule.samples_ms))
            stop = rule.reason(_last_forward(samples), time.perf_counter() - t)
        phases["timed"] = time.perf_counter() - t
        t = time.perf_counter()
        _complete(record, {"profiler": "cpu", "logits": logits, "samples": samples, "builds": [],
                           "timings": _timings_from_samples(samples, conv_names), "environment": environment(),
                           "stopping": rule.record(stop)}, ctx)
        record["phases_s"] = {**phases, "check": time.perf_counter() - t}
        finish(record, time.perf_counter() - started)


def build_requests(network, variants: dict[str, Variant], run: RunSpec) -> list[BuildRequest]:
    """Every module a setting loads: layers.cu, and each conv layer's variant with its macros
    (tunables, and the layer's shape for variants that compile it in)."""
    requests = [BuildRequest.of(LAYERS_SOURCE, "layers", {"CONV_T": "double"} if network.dtype == "float64" else {})]
    for name, variant in variants.items():
        params = variant.resolve_params(run.params.get(name), f"params.{name}")
        requests.append(BuildRequest.of(variant.source, variant.name,
                                        variant.defines(params, network.variant_shape(network.layer(name), variant.fuses))))
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
    spec, clock = ctx.spec, backend.clock
    chunks = pass_chunks(spec.batch, spec.streams, spec.chunk_images)
    # The builds compile on the CPU cores (for NVML's idea of the GPU's architecture: no CUDA context
    # is needed to know it; sm_90 where there is no GPU, so that a kernel that does not compile says
    # so on any machine), while other jobs may hold the GPU.
    arch = spec.arch if spec.arch != "auto" else host_gpu_arch() or "sm_90"
    requests = [r for i in todo for r in build_requests(ctx.batch.network, ctx.variants, ctx.runs[i])]
    holder = f"job {spec.job_id} ({spec.experiment})"
    with ExitStack() as stack:
        t = clock()
        builds = stack.enter_context(backend.compile_all(requests, arch)).wait()
        host_environment()  # read now (counted here): what a job does while it holds the GPU, others wait for
        shared["compile"] = clock() - t
        # The GPU's lock before this process opens a CUDA context: another process's context slows
        # the kernels being timed (on the lent H100, each context opened beside a timed job slowed
        # about nine of its passes, up to twice as long; a driver start or NVML read did not: see
        # docs/throughput.md). The lock is let go after the GPU is closed.
        t = clock()
        stack.enter_context(bind_free_gpu(holder))
        shared["gpu_wait"] = clock() - t
        t = clock()
        try:
            gpu = stack.enter_context(backend.gpu())
        except MachineError:
            # A kernel that does not compile is a result on any machine (the builds ran on the CPU):
            # those settings are stored; the job is the machine's failure only if any other remains.
            failed = _compile_errors(ctx, todo, builds)
            env = environment() if failed else None
            for i, error in failed.items():
                record = ctx.skeleton(i)
                record.update(error=error, environment=env)
                finish(record, 0.0)
            if len(failed) < len(todo):
                raise
            return
        if not holds_lock_of(gpu.uuid):  # NVML could not say which GPU CUDA would open: lock the one it did
            stack.enter_context(gpu_lock(gpu.uuid, holder))
        monitor = stack.enter_context(backend.monitor(gpu.uuid, gpu.pci_bus_id))
        env = environment(gpu, monitor)  # NVML opened once: each opening is ~0.03 s of the lock's time
        shared["context"] = clock() - t
        t = clock()
        streams = [gpu.stream() for _ in range(spec.streams)]
        buffers = pipeline_buffers(gpu, ctx.batch.network, ctx.batch.images, spec.host_memory, streams[0])
        shared["allocate"] = clock() - t
        # Where NVML could not tell (GPUs of several kinds), each op compiles for this GPU itself.
        session = GpuSession(gpu, streams, buffers, monitor, chunks, backend, arch if spec.arch != "auto" else gpu.arch,
                             gpu.l2_flusher() if spec.cache == "cold" else None)
        settings = progress(todo, desc=f"job {spec.job_id}", unit="setting", enabled=len(todo) > 1)
        for n, i in enumerate(settings):
            started, record = clock(), ctx.skeleton(i)
            try:
                with nvtx_range(f"setting {i}"), gpu.scope():
                    measured = _measure_gpu_setting(session, ctx, i)
                t = clock()
                _complete(record, measured, ctx)
                record["phases_s"]["check"] = clock() - t
            except Exception as e:  # this setting's failure (compile, launch, shape): the others go on
                record.update(status="failed", error=failure_message(e))
            record["environment"] = env
            finish(record, clock() - started)
            # The job log's line; on a terminal, drawn above the bar rather than through it.
            settings.write(f"[{n + 1}/{len(todo)}] {_describe(record)}", file=sys.stdout)
            sys.stdout.flush()


def _measure_gpu_setting(session: GpuSession, ctx: JobContext, index: int) -> dict:
    """One setting: its network (compiled builds loaded, weights, lanes), warm-up and timed passes."""
    gpu, streams, buffers, chunks = session.gpu, session.streams, session.buffers, session.chunks
    run, network, clock = ctx.runs[index], ctx.batch.network, session.backend.clock
    conv_names = list(ctx.variants)  # the timed layers: a fused network's conv1 times the later convs too
    phases, samples = {}, []
    t = clock()
    plan = ConvPlan(ctx.variants, {layer: var.resolve_params(run.params.get(layer), f"params.{layer}")
                                   for layer, var in ctx.variants.items()}, session.arch)
    net = session.backend.network(gpu, network, ctx.batch.weights, plan, len(streams), max(hi - lo for lo, hi in chunks))
    poison_logits(gpu, buffers, streams[0])  # so a setting that writes nothing cannot pass with the last one's logits
    phases["setup"] = clock() - t

    monitor, slowed = session.monitor, GpuHealth()

    def forward(tag: str, repeat: int | None):
        with nvtx_range(tag):
            marks = {}
            start, h2d_end, d2h_start, end = pipeline_pass(gpu, net, streams, chunks, buffers, marks, session.flush)
            end.sync()
            if repeat is None:
                return
            slowed.saw(repeat, monitor.slowdowns())

            def add(metric, layer, value):
                samples.append({"metric": metric, "layer": layer, "repeat": repeat, "value": value})

            # A cold pass's L2 flushes run between its layers on the one stream: its times leave them out.
            flush_ms = sum(e - b for b, e in marks.get(FLUSH, []))
            add("forward_ms", None, end - start - flush_ms)
            if session.flush is not None:
                add("l2_flush_ms", None, flush_ms)
            if len(chunks) == 1:  # with several chunks the copies of one interleave with others' kernels
                add("h2d_ms", None, h2d_end - start)
                add("compute_ms", None, d2h_start - h2d_end - flush_ms)
                add("d2h_ms", None, end - d2h_start)
            if len(streams) == 1:  # with several streams, event intervals include other streams' work
                for name in conv_names:
                    add("op_time_ms", name, sum(e - b for b, e in marks[name]))

    t = clock()
    for w in range(run.warmup):
        forward(f"warmup {w}", None)
    phases["warmup"] = clock() - t
    rule, stop = StoppingRule.of(run.repeats, run.stopping), None
    # NVML's energy query takes milliseconds; it is read per pass only where a power can come of it.
    energy = EnergyCounter()
    energy_mj = monitor.energy_mj if energy.can_tell(rule.max_samples_taken, run.energy_window_s) else lambda: None
    clocks = monitor.clocks()  # at the start of the timed part
    energy.read(energy_mj(), clock())
    t = clock()
    while stop is None:
        repeat = len(rule.samples_ms)
        forward(f"repeat {repeat}", repeat)
        energy.read(energy_mj(), clock())
        stop = rule.reason(_last_forward(samples), clock() - t)
    phases["timed"] = clock() - t
    passes, clocks_after = len(rule.samples_ms), monitor.clocks()
    # A timed part shorter than the counter's steps can tell is followed by more passes of the same
    # kind, untimed (outside any "repeat" range), until the counter has stepped enough: the power
    # over those passes gives the energy of the timed ones. At most energy_window_s of them.
    t, extra = clock(), 0
    while energy.counting and energy.watts(passes + extra) is None and clock() - t < run.energy_window_s:
        forward(f"energy {extra}", None)
        energy.read(energy_mj(), clock())
        extra += 1
    if extra:
        phases["energy"] = clock() - t
    return {"profiler": "events", "logits": np.array(buffers.logits_host, copy=True), "samples": samples,
            "builds": [b.record() for b in net.builds], "timings": _timings_from_samples(samples, conv_names),
            "clocks": clocks, "clocks_after": clocks_after, "energy": energy.record(phases["timed"], passes, extra),
            **slowed.record(passes), "phases_s": phases, "stopping": rule.record(stop)}


@dataclass
class GpuHealth:
    """What held the GPU's clocks down during a setting's timed passes: the NVML slowdown bits seen
    after each pass, and which passes they were seen after (None: NVML could not tell)."""

    known: bool = False
    reasons: int = 0
    repeats: list[int] = field(default_factory=list)

    def saw(self, repeat: int, slowdowns: int | None) -> None:
        if slowdowns is None:
            return
        self.known = True
        if slowdowns:
            self.reasons |= slowdowns
            self.repeats.append(repeat)

    def record(self, passes: int) -> dict:
        """The measurement's `throttle` ({reasons, repeats} or None) and its `note`."""
        if not self.known:
            return {"throttle": None, "note": None}
        names = slowdown_names(self.reasons)
        note = (f"{len(self.repeats)} of {passes} timed passes ran with the clocks held down ({', '.join(names)})"
                if self.repeats else None)
        return {"throttle": {"reasons": names, "repeats": self.repeats}, "note": note}


@dataclass
class EnergyCounter:
    """NVML's energy counter (millijoules), read before the timed passes and after each. The driver
    advances it in steps tens of milliseconds apart, so readings a few passes apart differ by nothing
    or by a whole step: the GPU's mean power is taken between the first and the last step seen, and
    only when those lie at least MIN_SPAN_PASSES passes apart (a step is seen up to a pass late).
    Otherwise the power is not known, and None says so rather than a number off by a step."""

    MIN_SPAN_PASSES = 10
    readings: list[tuple[float, int]] = field(default_factory=list)

    def read(self, millijoules: int | None, now: float) -> None:
        """A reading of the counter taken at `now` (seconds on the job's clock); None: NVML has no counter."""
        if millijoules is not None:
            self.readings.append((now, millijoules))

    @classmethod
    def can_tell(cls, max_passes: int, window_s: float) -> bool:
        """Whether readings could give a power at all: the steps must lie MIN_SPAN_PASSES passes
        apart, so a setting of fewer timed passes, with no energy window after them, never has one."""
        return max_passes >= cls.MIN_SPAN_PASSES or window_s > 0

    @property
    def counting(self) -> bool:
        """Whether NVML has a counter to read at all."""
        return bool(self.readings)

    def watts(self, passes: int) -> float | None:
        """The mean power over the `passes` passes read so far, or None while the counter's steps
        span too few of them."""
        steps = [(now, after) for (_, before), (now, after) in zip(self.readings, self.readings[1:]) if after != before]
        if len(steps) < 2 or passes == 0:
            return None
        pass_s = (self.readings[-1][0] - self.readings[0][0]) / passes
        (t0, e0), (t1, e1) = steps[0], steps[-1]
        return (e1 - e0) / 1000 / (t1 - t0) if t1 - t0 >= self.MIN_SPAN_PASSES * pass_s else None

    def record(self, timed_s: float, passes: int, extra_passes: int = 0) -> dict | None:
        """The measurement's `energy`: the whole GPU's over the timed part, idle gaps between passes
        included, at the power measured over the timed passes and the `extra_passes` run after them."""
        watts = self.watts(passes + extra_passes)
        if watts is None:
            return None
        joules = watts * timed_s
        return {"joules": joules, "passes": passes, "joules_per_pass": joules / passes, "watts": watts,
                "extra_passes": extra_passes}


def _last_forward(samples: list[dict]) -> float:
    """The forward time of the pass just sampled: what the stopping rule watches."""
    return next(s["value"] for s in reversed(samples) if s["metric"] == "forward_ms")


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

