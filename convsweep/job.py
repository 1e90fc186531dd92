"""One job: spec -> compile -> data -> warm-up -> timed repeats -> check -> one result JSON.

`run_job` is what a Snakemake rule calls. Under nsys it re-runs itself (`measure`) inside
`nsys profile`, then replaces the event timings with the kernel and copy records of the
report. Whatever happens, exactly one result file is written, atomically; a failure is a
result too (status `failed` and the message), so the sweep goes on and the store keeps it.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from . import nsys as nsys_mod
from .compile import LAYERS_SOURCE, source_hash
from .config import JobSpec, cache_dir, canonical_hash
from .errors import CompileError, ConvsweepError
from .gpulock import gpu_lock
from .paths import ROOT, relative_to_root
from .provenance import GpuMonitor, environment, git_state
from .variants import get_variant

FORMAT = 2  # 2: measurement_id, git, clocks and sources (docs/result-format.md)


# -- small helpers ------------------------------------------------------------------------------
def write_text_atomic(path: Path, text: str) -> None:
    """Write to a uniquely named temporary file beside `path`, then rename: readers never see half a
    file, and two writers never share a temporary name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: dict) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, default=_json_default, allow_nan=False) + "\n")


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def _finite(value):
    """JSON has no NaN: unmeasurable or non-finite numbers are stored as null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _median(values):
    return statistics.median(values) if values else None


def remove_stale_temporaries(path: Path) -> None:
    """Delete the temporary files a killed writer of `path` left beside it (write_text_atomic's names)."""
    for stale in Path(path).parent.glob(f".{Path(path).name}.*.tmp"):
        stale.unlink(missing_ok=True)


def kernel_sources_of(variants: dict) -> dict[str, str]:
    """{kernel file: source hash} of every kernel a job runs: its variants' files and, on the GPU,
    layers.cu. Known before anything compiles, so a run that failed still says what code it tried."""
    files = [v.source for v in variants.values() if not v.is_cpu]
    if files:
        files.append(LAYERS_SOURCE)
    return {relative_to_root(f): source_hash(f) for f in dict.fromkeys(files)}


# -- inputs -------------------------------------------------------------------------------------
def _load_network(spec: JobSpec):
    from .network import load_network

    net_path = Path(spec.network)
    return load_network(net_path if net_path.is_absolute() else ROOT / net_path)


def load_batch(network, dataset_spec: str | dict, batch: int):
    """(dataset, weights, indices of the batch's images): a named or IDX-file dataset, or `random`
    (exactly the batch: those workloads are large per image)."""
    from .data import batch_indices, load_dataset, random_dataset
    from .network import load_weights

    size = network.input_shape[-1]
    if dataset_spec == "random":
        dataset = random_dataset(network.input_shape, batch)
    elif isinstance(dataset_spec, dict):
        dataset = load_dataset(dataset_spec["name"], images=dataset_spec["images"], labels=dataset_spec["labels"],
                               image_size=size)
    else:
        dataset = load_dataset(dataset_spec, image_size=size)
    return dataset, load_weights(network), batch_indices(len(dataset.images), batch)


def _load_inputs(spec: JobSpec):
    network = _load_network(spec)
    return (network, *load_batch(network, spec.dataset, spec.batch))


def reference_logits(network, dataset, weights) -> np.ndarray:
    """float64 logits of every image of the dataset, cached: the truth every run is checked against."""
    from .network import reference_forward

    weights_hash = hashlib.sha256(b"".join(k.encode() + v.tobytes() for k, v in sorted(weights.items()))).hexdigest()
    key = canonical_hash([dataset.sha256, weights_hash, Path(network.path).read_text(), list(network.input_shape)])
    path = cache_dir() / "reference" / f"{key}.npy"
    try:
        cached = np.load(path)
        if cached.shape[0] == len(dataset.images):
            return cached
    except (OSError, ValueError):
        pass
    logits = reference_forward(network, {k: v.astype(np.float64) for k, v in weights.items()},
                               dataset.images.astype(np.float64), dtype=np.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
    with os.fdopen(fd, "wb") as f:
        np.save(f, logits)
    os.replace(tmp, path)
    return logits


def _chunks(batch: int, streams: int, chunk_images: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) image ranges: `chunk_images` each, or by default one chunk for one stream (no
    overlap) and four per stream otherwise, so each stream's copies can hide others' kernels."""
    size = chunk_images or math.ceil(batch / (1 if streams == 1 else min(batch, 4 * streams)))
    return [(lo, min(lo + size, batch)) for lo in range(0, batch, size)]


# -- measurement --------------------------------------------------------------------------------
def measure(spec: JobSpec, keep_logits: bool = False) -> dict:
    """Run the job in this process and time it with CUDA events (or the CPU clock for CPU variants).

    `keep_logits` leaves the output array in the result (under "logits") for callers that compare
    runs; result files never hold it.
    """
    phases = {}
    t = time.perf_counter()
    network, dataset, weights, idx = _load_inputs(spec)
    phases["load"] = time.perf_counter() - t
    variants = {layer: get_variant(name) for layer, name in spec.variants.items()}
    params = {layer: variants[layer].resolve_params(spec.params.get(layer), f"params.{layer}") for layer in variants}
    cpu = {v.is_cpu for v in variants.values()}
    if cpu == {True}:
        result = _measure_cpu(spec, network, weights, dataset.images[idx], phases)
    elif cpu == {False}:
        result = _measure_gpu(spec, network, weights, dataset.images[idx], variants, params, phases)
    else:
        raise ConvsweepError("a job cannot mix the CPU 'reference' variant with GPU variants")
    t = time.perf_counter()
    ref = reference_logits(network, dataset, weights)[idx]
    phases["check"] = time.perf_counter() - t
    logits = result["logits"] if keep_logits else result.pop("logits")
    status, error, err, accuracy, agreement = check_logits(logits, ref, dataset.labels, idx, variants)
    from .runner import conv_shape

    shapes = {layer.name: conv_shape(layer, spec.batch, network.dtype) for layer in network.conv_layers}
    result.update(status=status, error=error, accuracy=accuracy, max_rel_err=_finite(err),
                  tolerance=max(v.tolerance for v in variants.values()), prediction_agreement=agreement,
                  images={"batch": spec.batch, "unique": len(dataset.images), "cycled": spec.batch > len(dataset.images)},
                  phases_s=phases, floors={name: {"bytes": s.min_bytes, "flops": s.flops} for name, s in shapes.items()})
    return result


ACCURACY_SLACK = {"fp16": 0.005}  # fp16-class runs may differ from the reference's accuracy by 0.5 points
MIN_AGREEMENT = 0.999  # other runs must predict the reference's class on 99.9% of images


def check_logits(logits, ref, labels, idx, variants) -> tuple:
    """(status, error, max relative error, accuracy, prediction agreement) of one run's output.

    The output must be finite and within the loosest variant tolerance of the float64 reference
    (normwise: max |y - ref| / max |ref|). With labels it must also classify like the reference:
    the same prediction on 99.9% of images, or for fp16-class runs an accuracy within 0.5 points.
    """
    scale = float(np.max(np.abs(ref))) or 1.0
    err = float(np.max(np.abs(logits.astype(np.float64) - ref))) / scale if logits.size else 0.0
    tolerance = max(v.tolerance for v in variants.values())
    accuracy = agreement = None
    if labels is not None:
        predicted, expected = np.argmax(logits, axis=1), np.argmax(ref, axis=1)
        accuracy = float(np.mean(predicted == labels[idx]))
        agreement = float(np.mean(predicted == expected))
    if not math.isfinite(err):
        return "incorrect", "output holds NaN or Inf (unwritten or overflowed elements)", err, accuracy, agreement
    if err > tolerance:
        return "incorrect", f"max relative error {err:.3g} exceeds the {tolerance:g} tolerance", err, accuracy, agreement
    if labels is not None:
        slack = max(ACCURACY_SLACK.get(v.precision, -1.0) for v in variants.values())
        ref_accuracy = float(np.mean(np.argmax(ref, axis=1) == labels[idx]))
        if slack >= 0 and abs(accuracy - ref_accuracy) > slack:
            return ("incorrect", f"accuracy {accuracy:.4f} is more than {slack * 100:g} points from the reference's "
                    f"{ref_accuracy:.4f}", err, accuracy, agreement)
        if slack < 0 and agreement < MIN_AGREEMENT:
            return ("incorrect", f"predictions match the reference on {agreement:.2%} of images "
                    f"(needs {MIN_AGREEMENT:.1%})", err, accuracy, agreement)
    return "ok", None, err, accuracy, agreement


def _measure_cpu(spec, network, weights, images, phases) -> dict:
    """The CPU reference: synchronous numpy, so a host clock around each layer is an honest timer."""
    from .network import reference_layer

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
        return _finite(_median([s["value"] for s in samples if s["metric"] == metric and s["layer"] == layer]))

    return {"op_time_ms": {name: med("op_time_ms", name) for name in conv_names},
            "h2d_ms": med("h2d_ms"), "d2h_ms": med("d2h_ms"), "compute_ms": med("compute_ms"),
            "forward_ms": med("forward_ms"), "overlap": med("overlap"), "streams_used": med("streams_used")}


def _measure_gpu(spec, network, weights, images, variants, params, phases) -> dict:
    from .gpu import Gpu
    from .runner import GpuNetwork, nvtx_range, pipeline_buffers, pipeline_pass

    conv_names = [layer.name for layer in network.conv_layers]
    chunks = _chunks(spec.batch, spec.streams, spec.chunk_images)
    capacity = max(hi - lo for lo, hi in chunks)
    samples = []
    with ExitStack() as stack:
        t = time.perf_counter()
        gpu = stack.enter_context(Gpu())
        # Everything this job does on the GPU, uploads included, happens under the GPU's lock.
        waiting = time.perf_counter()
        stack.enter_context(gpu_lock(gpu.uuid, f"job {spec.job_id} ({spec.experiment})"))
        phases["gpu_wait"] = time.perf_counter() - waiting
        monitor = stack.enter_context(GpuMonitor(gpu.uuid, gpu.pci_bus_id))
        for layer, var in variants.items():
            if gpu.compute_capability < var.min_cc:
                raise ConvsweepError(f"variant '{var.name}' needs compute capability {var.min_cc}, {gpu.name} has {gpu.compute_capability}")
        streams = [gpu.stream() for _ in range(spec.streams)]
        net = GpuNetwork(gpu, network, weights, variants, params, len(streams), capacity, streams[0])
        phases["compile"] = time.perf_counter() - t - phases["gpu_wait"]  # context, compile or cache hit, load
        t = time.perf_counter()
        x_host, x_dev, logits_host, logits_dev = pipeline_buffers(gpu, network, images, spec.host_memory, streams[0])
        phases["allocate"] = time.perf_counter() - t

        def forward(tag: str, repeat: int | None):
            with nvtx_range(tag):
                marks = {}
                start, h2d_end, d2h_start, end = pipeline_pass(gpu, net, streams, chunks, x_host, x_dev,
                                                               logits_host, logits_dev, marks)
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
        logits = np.array(logits_host, copy=True)
        builds = [b.record() for b in net.builds]
        nsys_path = nsys_mod.find_nsys()
        env = environment(gpu, nsys_mod.nsys_version(nsys_path) if nsys_path else None)
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


def failure_message(e: Exception) -> str:
    """One line for the result; a bug (not a ConvsweepError) also leaves its traceback in the job log."""
    if isinstance(e, ConvsweepError):
        return str(e).splitlines()[0]
    traceback.print_exc()
    return f"{type(e).__name__}: {e}".splitlines()[0]


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
    result["phases_s"] = {k: _finite(v) for k, v in result["phases_s"].items()}
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
    result["timings"].update({k: _finite(summary[k]) for k in ("h2d_ms", "d2h_ms", "compute_ms", "forward_ms", "overlap", "streams_used")})
    result["timings"]["op_time_ms"] = {k: _finite(v) for k, v in summary["op_time_ms"].items()}
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
