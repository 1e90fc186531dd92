"""One job: spec -> compile -> data -> warm-up -> timed repeats -> check -> one result JSON.

`run_job` is what a Snakemake rule calls. Under nsys it re-runs itself (`measure`) inside
`nsys profile`, then replaces the event timings with the kernel and copy records of the
report. Whatever happens, exactly one result file is written, atomically; a failure is a
result too (status `failed` and the message), so the sweep goes on and the store keeps it.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from . import nsys as nsys_mod
from .checks import check_logits
from .compile import LAYERS_SOURCE, source_hash
from .config import JobSpec
from .errors import CompileError, ConvsweepError, failure_message
from .fileio import remove_stale_temporaries, write_json_atomic
from .gpulock import gpu_lock
from .inputs import Batch, load_batch
from .network import load_network, reference_layer
from .numbers import finite, median
from .paths import relative_to_root, resolve_network_path
from .provenance import GpuMonitor, environment, git_state
from .runner import Backend, ConvPlan, nvtx_range, pass_chunks, pipeline_buffers, pipeline_pass
from .variants import get_variant

# The result format written: the newest of workflow/schemas/result.schema.yaml (a store test ties
# the two; reading the schema here would cost every job process its parse).
FORMAT = 2


def kernel_sources_of(variants: dict) -> dict[str, str]:
    """{kernel file: source hash} of every kernel a job runs: its variants' files and, on the GPU,
    layers.cu. Known before anything compiles, so a run that failed still says what code it tried."""
    files = [v.source for v in variants.values() if not v.is_cpu]
    if files:
        files.append(LAYERS_SOURCE)
    return {relative_to_root(f): source_hash(f) for f in dict.fromkeys(files)}


def _load_network(spec: JobSpec):
    return load_network(resolve_network_path(spec.network))


# -- measurement --------------------------------------------------------------------------------
def measure(spec: JobSpec, keep_logits: bool = False, backend: Backend = Backend()) -> dict:
    """Run the job in this process and time it with CUDA events (or the CPU clock for CPU variants).

    `keep_logits` leaves the output array in the result (under "logits") for callers that compare
    runs; result files never hold it. `backend` runs the kernels (tests pass numpy stand-ins).
    """
    phases = {}
    t = time.perf_counter()
    network = _load_network(spec)
    batch = load_batch(network, spec.dataset, spec.batch)
    phases["load"] = time.perf_counter() - t
    variants = {layer: get_variant(name) for layer, name in spec.variants.items()}
    plan = ConvPlan(variants, {layer: var.resolve_params(spec.params.get(layer), f"params.{layer}")
                               for layer, var in variants.items()})
    cpu = {v.is_cpu for v in variants.values()}
    if cpu == {True}:
        result = _measure_cpu(spec, batch, phases)
    elif cpu == {False}:
        result = _measure_gpu(spec, batch, plan, phases, backend)
    else:
        raise ConvsweepError("a job cannot mix the CPU 'reference' variant with GPU variants")
    t = time.perf_counter()
    ref = batch.reference
    phases["check"] = time.perf_counter() - t
    logits = result["logits"] if keep_logits else result.pop("logits")
    check = check_logits(logits, ref, batch.dataset.labels, batch.idx, variants.values())
    shapes = {layer.name: network.conv_shape(layer, spec.batch) for layer in network.conv_layers}
    result.update(**check.record(), tolerance=max(v.tolerance for v in variants.values()),
                  images={"batch": spec.batch, "unique": len(batch.dataset.images),
                          "cycled": spec.batch > len(batch.dataset.images)},
                  phases_s=phases, floors={name: {"bytes": s.min_bytes, "flops": s.flops} for name, s in shapes.items()})
    return result


def _measure_cpu(spec: JobSpec, batch: Batch, phases: dict) -> dict:
    """The CPU reference: synchronous numpy, so a host clock around each layer is an honest timer."""
    network, weights, images = batch.network, batch.weights, batch.images
    conv_names = [layer.name for layer in network.conv_layers]
    dtype = np.dtype(network.dtype)
    cast = {k: v.astype(dtype) for k, v in weights.items()}
    samples = []

    def forward(repeat):
        x = images.astype(dtype)
        t0 = time.perf_counter()
        for layer in network.layers:
            t = time.perf_counter()
            x = reference_layer(layer, cast, x)
            if repeat is not None and layer.name in conv_names:
                samples.append({"metric": "op_time_ms", "layer": layer.name, "repeat": repeat, "value": (time.perf_counter() - t) * 1e3})
        if repeat is not None:
            samples.append({"metric": "forward_ms", "layer": None, "repeat": repeat, "value": (time.perf_counter() - t0) * 1e3})
        return x

    t = time.perf_counter()
    for _ in range(spec.warmup):
        forward(None)
    phases["warmup"] = time.perf_counter() - t
    t = time.perf_counter()
    for r in range(spec.repeats):
        logits = forward(r)
    phases["timed"] = time.perf_counter() - t
    return {"profiler": "cpu", "logits": logits, "samples": samples, "builds": [], "kernels": [], "memcpys": [],
            "timings": _timings_from_samples(samples, conv_names), "environment": environment()}


def _timings_from_samples(samples, conv_names) -> dict:
    def med(metric, layer=None):
        return finite(median(s["value"] for s in samples if s["metric"] == metric and s["layer"] == layer))

    return {"op_time_ms": {name: med("op_time_ms", name) for name in conv_names},
            "h2d_ms": med("h2d_ms"), "d2h_ms": med("d2h_ms"), "compute_ms": med("compute_ms"),
            "forward_ms": med("forward_ms"), "overlap": med("overlap"), "streams_used": med("streams_used")}


def _measure_gpu(spec: JobSpec, batch: Batch, plan: ConvPlan, phases: dict, backend: Backend) -> dict:
    network = batch.network
    conv_names = [layer.name for layer in network.conv_layers]
    chunks = pass_chunks(spec.batch, spec.streams, spec.chunk_images)
    capacity = max(hi - lo for lo, hi in chunks)
    samples = []
    with ExitStack() as stack:
        t = time.perf_counter()
        gpu = stack.enter_context(backend.gpu())
        # Everything this job does on the GPU, uploads included, happens under the GPU's lock.
        waiting = time.perf_counter()
        stack.enter_context(gpu_lock(gpu.uuid, f"job {spec.job_id} ({spec.experiment})"))
        phases["gpu_wait"] = time.perf_counter() - waiting
        monitor = stack.enter_context(GpuMonitor(gpu.uuid, gpu.pci_bus_id))
        streams = [gpu.stream() for _ in range(spec.streams)]
        net = backend.network(gpu, network, batch.weights, plan, len(streams), capacity)
        phases["compile"] = time.perf_counter() - t - phases["gpu_wait"]  # context, compile or cache hit, load
        t = time.perf_counter()
        buffers = pipeline_buffers(gpu, network, batch.images, spec.host_memory, streams[0])
        phases["allocate"] = time.perf_counter() - t

        def forward(tag: str, repeat: int | None):
            with nvtx_range(tag):
                marks = {}
                start, h2d_end, d2h_start, end = pipeline_pass(gpu, net, streams, chunks, buffers, marks)
                end.sync()
                if repeat is None:
                    return
                add = lambda metric, layer, value: samples.append({"metric": metric, "layer": layer, "repeat": repeat, "value": value})
                add("forward_ms", None, end - start)
                if len(chunks) == 1:  # with several chunks the copies of one interleave with others' kernels
                    add("h2d_ms", None, h2d_end - start)
                    add("compute_ms", None, d2h_start - h2d_end)
                    add("d2h_ms", None, end - d2h_start)
                if len(streams) == 1:  # with several streams, event intervals include other streams' work
                    for name in conv_names:
                        add("op_time_ms", name, sum(e - b for b, e in marks[name]))

        t = time.perf_counter()
        for w in range(spec.warmup):
            forward(f"warmup {w}", None)
        phases["warmup"] = time.perf_counter() - t
        clocks = monitor.clocks()  # at the start of the timed part
        t = time.perf_counter()
        for r in range(spec.repeats):
            forward(f"repeat {r}", r)
        phases["timed"] = time.perf_counter() - t
        logits = np.array(buffers.logits_host, copy=True)
        builds = [b.record() for b in net.builds]
        env = environment(gpu)
    return {"profiler": "events", "logits": logits, "samples": samples, "builds": builds, "kernels": [], "memcpys": [],
            "timings": _timings_from_samples(samples, conv_names), "environment": env, "clocks": clocks}


# -- the job ------------------------------------------------------------------------------------
def _skeleton(spec: JobSpec) -> dict:
    """A result before measuring: identity and provenance; the status stays `failed` until measured."""
    result = {"format": FORMAT, "measurement_id": uuid.uuid4().hex, "job_id": spec.job_id, "run_key": spec.run_key,
              "spec": spec.to_dict(), "sweep": spec.sweep, "git": git_state(), "sources": {},
              "clocks": {"sm_mhz": None, "memory_mhz": None}, "environment": None,
              "status": "failed", "error": None, "profiler": None,
              "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
              "accuracy": None, "max_rel_err": None, "tolerance": None, "images": None,
              "timings": {"op_time_ms": {}, "h2d_ms": None, "d2h_ms": None, "compute_ms": None, "forward_ms": None,
                          "overlap": None, "streams_used": None, "total_s": None, "compile_ms": None},
              "phases_s": {}, "floors": {}, "samples": [], "builds": [], "kernels": [], "memcpys": [], "files": {}}
    try:
        result["sources"] = kernel_sources_of({layer: get_variant(name) for layer, name in spec.variants.items()})
    except (ConvsweepError, OSError):  # an unknown variant or unreadable file: the job fails with the reason
        pass
    return result


def _merge(result: dict, measured: dict) -> None:
    """Fold a measurement into the result; its timings and phases add to those already there
    (process_start is set before measuring)."""
    timings, phases = measured.pop("timings"), measured.pop("phases_s")
    result.update(measured)
    result["timings"].update(timings)
    result["phases_s"].update(phases)
    result["timings"]["compile_ms"] = sum(b["compile_ms"] for b in result["builds"] if not b["cache_hit"]) if result["builds"] else None


def _is_cpu_job(spec: JobSpec) -> bool:
    return all(get_variant(v).is_cpu for v in spec.variants.values())


def run_job(spec: JobSpec, out_path: Path, process_age: float | None = None,
            compile_errors: list[str] | None = None) -> dict:
    """Run one job and write its result JSON; returns the result. Never raises for a job failure.

    `process_age` is how long the process had run before this call (cli.process_age()); it is
    phases_s.process_start, and total_s counts from it. Without it total_s is this call's time.
    `compile_errors` (from the job's build files) fail the job at once: no GPU time is spent.
    """
    out_path = Path(out_path)
    started = time.perf_counter()
    remove_stale_temporaries(out_path)
    result = _skeleton(spec)
    if process_age is not None:
        result["phases_s"]["process_start"] = process_age
    try:
        if compile_errors:
            raise CompileError(compile_errors[0])
        nsys_path = nsys_mod.find_nsys() if spec.profiler == "nsys" else None
        if nsys_path and not _is_cpu_job(spec):
            _run_under_nsys(spec, out_path, nsys_path, result)
        else:
            _merge(result, measure(spec))
            if spec.profiler == "nsys" and result["profiler"] == "events":
                result["profiler_note"] = "nsys not found: timed with CUDA events"
    except Exception as e:
        result.update(status="failed", error=failure_message(e))
    if result["environment"] is None:
        result["environment"] = environment()
    result["phases_s"] = {k: finite(v) for k, v in result["phases_s"].items()}
    result["timings"]["total_s"] = (process_age or 0.0) + time.perf_counter() - started
    write_json_atomic(out_path, result)
    return result


def _run_under_nsys(spec: JobSpec, out_path: Path, nsys_path: str, result: dict) -> None:
    report_base = out_path.with_suffix("")
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, inner_out = Path(tmp) / "spec.json", Path(tmp) / "inner.json"
        spec_file.write_text(json.dumps({**spec.to_dict(), "sweep": spec.sweep}))
        t = time.perf_counter()
        sqlite_path = nsys_mod.profile([sys.executable, "-m", "convsweep.cli", "measure", "--spec-file", str(spec_file),
                                        "--out", str(inner_out)], report_base, nsys_path, log=None)
        wall = time.perf_counter() - t
        if not inner_out.is_file():
            raise ConvsweepError("the profiled job wrote no result (it crashed; see the job log)")
        inner = json.loads(inner_out.read_text())
    inner_total = sum(v for v in inner.get("phases_s", {}).values() if v)
    if inner.get("status") == "failed" and inner.get("error"):
        result.update(status="failed", error=inner["error"], environment=inner.get("environment"))
        return
    conv_names = list(spec.variants)
    activities = nsys_mod.read_activities(sqlite_path, {layer.name for layer in _load_network(spec).layers})
    summary = nsys_mod.summarize(activities, conv_names)
    if summary["repeats_seen"] != spec.repeats:
        raise ConvsweepError(f"nsys report holds {summary['repeats_seen']} timed repeats, expected {spec.repeats}")
    event_timings = inner.pop("timings")
    phases = {**result["phases_s"], **inner.pop("phases_s", {})}
    result.update({k: v for k, v in inner.items() if k != "samples"}, phases_s=phases)
    result["timings"].update({k: finite(summary[k]) for k in ("h2d_ms", "d2h_ms", "compute_ms", "forward_ms", "overlap", "streams_used")})
    result["timings"]["op_time_ms"] = {k: finite(v) for k, v in summary["op_time_ms"].items()}
    result["timings"]["event_forward_ms"] = event_timings.get("forward_ms")
    result["timings"]["compile_ms"] = sum(b["compile_ms"] for b in result["builds"] if not b["cache_hit"])
    result.update(profiler="nsys", samples=summary["samples"], kernels=summary["kernels"], memcpys=summary["memcpys"],
                  files={"nsys_report": str(report_base.with_suffix(".nsys-rep")), "nsys_sqlite": str(sqlite_path)})
    result["phases_s"]["profile"] = max(0.0, wall - inner_total)


def measure_to_file(spec: JobSpec, out_path: Path) -> None:
    """The inner half of an nsys job: measure, and write what was measured (or the failure)."""
    try:
        measured = measure(spec)
    except Exception as e:
        measured = {"status": "failed", "error": failure_message(e), "environment": environment()}
    write_json_atomic(out_path, measured)
