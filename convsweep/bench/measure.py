"""Our kernels on the GPU, timed the way the bench reports them: the copy ceilings, every conv
candidate on fixed random inputs (checked against float64 before and after timing), the whole
forward with the best candidates, and the end-to-end pipeline jobs run. The inputs are fixed, and
every table of the bench says so: a kernel's ranking is a sweep's, whose passes are each on a round
no kernel has seen (convsweep.measure.integrity).

Every function takes the GPU (and, where it builds ops, the `Backend`) as an argument and
returns a record; a failure is a record with its message, never an exception.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from convsweep.model.checks import check_indices, check_logits, check_output, loosest_precision
from convsweep.base.errors import failure_message
from convsweep.device.floors import fastest_unit
from convsweep.device.gpu import DeviceArray
from convsweep.inputs.batch import Batch
from convsweep.model.network import Layer
from convsweep.model.reference import conv2d_reference, maxpool2d_reference
from convsweep.measure.runner import Backend, ConvPlan, pass_chunks, pipeline_buffers, pipeline_pass
from convsweep.sweep.config import variant_label
from convsweep.base.stats import StoppingRule
from convsweep.measure.timing import CudaEvents, pipeline_timer, sample
from convsweep.model.variants import ConvShape, get_variant
from .config import BenchConfig, Candidate
from .report import network_traffic, pick_best


@dataclass(frozen=True)
class Timing:
    """What every measurement needs: the batch, untimed warm-up runs, timed repeats, and the stream."""

    batch: int
    warmup: int
    repeats: int
    stream: Any

    def rule(self) -> StoppingRule:
        """A fresh rule that stops after `repeats` samples (a rule keeps the samples it took)."""
        return StoppingRule(repeats=self.repeats)


def event_samples(gpu, timing: Timing, run: Callable[[], None], min_warmup: int = 0) -> list[float]:
    """Warm up, then `repeats` runs each between two events on the stream, all enqueued before any
    is read; ms per run."""
    timer = CudaEvents(gpu, timing.stream, sync_each=False)
    return sample(timer, lambda marks: run(), timing.rule(), warmup=max(timing.warmup, min_warmup)).samples_ms


def measure_ceilings(gpu, timing: Timing, copy_bytes: int) -> dict:
    """Device-to-device copy (the memory floor's rate) and pinned host-to-device and device-to-host
    copies (the end to end's), timed with events."""
    stream = timing.stream
    src = gpu.alloc((copy_bytes,), np.uint8)
    dst = gpu.alloc((copy_bytes,), np.uint8)
    gpu.fill(src, 0x3F, stream)
    copy = event_samples(gpu, timing, lambda: gpu.copy(dst, src, stream), min_warmup=1)
    h2d_bytes = min(copy_bytes, 256 << 20)
    host = gpu.host_array((h2d_bytes,), np.uint8, "pinned")
    host[...] = 1
    head = DeviceArray(dst.ptr, (h2d_bytes,), np.dtype(np.uint8))
    h2d = event_samples(gpu, timing, lambda: gpu.upload(host, head, stream), min_warmup=1)
    d2h = event_samples(gpu, timing, lambda: gpu.download(head, host, stream), min_warmup=1)
    return {"copy_bytes": copy_bytes, "copy_samples_ms": copy, "h2d_bytes": h2d_bytes, "h2d_samples_ms": h2d,
            "d2h_samples_ms": d2h}


# -- conv candidates -----------------------------------------------------------------------------
@dataclass
class LayerInputs:
    """One conv layer's random problem, on the host and on the device; shared by its candidates."""

    x: np.ndarray
    w: np.ndarray
    b: np.ndarray
    x_dev: Any
    w_dev: Any
    b_dev: Any
    y_dev: Any  # room for the unfused output; fused variants write a smaller prefix
    check_idx: np.ndarray
    ref: np.ndarray  # float64 conv of the checked images (unfused)


def layer_inputs(gpu, timing: Timing, layer: Layer, seed: list[int], check_images: int) -> LayerInputs:
    """Random x, w, b for `layer` from `seed` (every candidate of a layer sees the same), and the
    float64 reference of the first and last `check_images` images."""
    c, h, w_ = layer.in_shape
    m, k = layer.out_channels, layer.kernel
    assert m is not None and k is not None and layer.stride is not None  # a conv layer's
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((timing.batch, c, h, w_), dtype=np.float32)
    w = rng.standard_normal((m, c, k, k), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    idx = check_indices(timing.batch, check_images)
    ref = conv2d_reference(x[idx].astype(np.float64), w.astype(np.float64), b.astype(np.float64), layer.stride)
    x_dev, w_dev, b_dev = (gpu.to_device(a, timing.stream) for a in (x, w, b))
    y_dev = gpu.alloc((timing.batch, *layer.out_shape), np.float32)
    return LayerInputs(x, w, b, x_dev, w_dev, b_dev, y_dev, idx, ref)


def _fused_reference(ref: np.ndarray, shape: ConvShape) -> np.ndarray:
    return maxpool2d_reference(np.maximum(ref, 0.0), shape.P, shape.PS) if shape.P else ref


def measure_candidate(gpu, timing: Timing, network, cand: Candidate, inputs: LayerInputs, backend: Backend) -> dict:
    """Check one candidate against float64, then time it; a failure is a record, not an exception."""
    var = get_variant(cand.variant)
    stream = timing.stream
    rec: dict[str, Any] = {
        "layer": cand.layer, "variant": cand.variant, "params": cand.params, "resolved_params": cand.resolved,
        "precision": var.precision, "unit": var.unit, "tolerance": var.tolerance, "fused": list(var.fuses),
        "status": "failed", "error": None, "max_rel_err": None, "max_rel_err_after": None, "samples_ms": []}
    try:
        shape = network.variant_shape(network.layer(cand.layer), var.fuses, timing.batch)
        rec.update(shape=dataclasses.asdict(shape), bytes=shape.min_bytes, flops=shape.flops)
        var.check_shape(shape, cand.resolved)
        op = backend.conv_op(gpu, var, cand.resolved, shape)
        rec["build"] = op.build.record()
        op.bind_weights(inputs.w_dev, inputs.b_dev, stream)
        y = DeviceArray(inputs.y_dev.ptr, shape.out_shape, np.dtype(np.float32))  # fused outputs are smaller
        workspace = op.workspace(shape)

        def run():
            op.enqueue(stream, y, inputs.x_dev, shape, workspace)

        ref = _fused_reference(inputs.ref, shape)
        gpu.fill(y, 0xFF, stream)  # NaN: an element the kernel never writes fails the check
        run()
        y_host = np.empty(y.shape, np.float32)
        gpu.download(y, y_host, stream)
        stream.sync()
        before = check_output(y_host[inputs.check_idx], ref, var.tolerance, bool(np.isfinite(y_host).all()))
        del y_host
        rec.update(status=before.status, error=before.error, max_rel_err=before.max_rel_err)

        rec["samples_ms"] = event_samples(gpu, timing, run)

        after = np.empty((len(inputs.check_idx), *y.shape[1:]), np.float32)
        for i, image in enumerate(inputs.check_idx):  # the last run's output: the same images again
            gpu.download(y.rows(int(image), int(image) + 1), after[i : i + 1], stream)
        stream.sync()
        again = check_output(after, ref, var.tolerance)
        rec["max_rel_err_after"] = again.max_rel_err
        if before.status == "ok" and again.status != "ok":
            rec.update(status=again.status, error=f"after timing: {again.error} (a moving error is a race)")
    except Exception as e:
        rec.update(status="failed", error=failure_message(e))
    return rec


def best_variants(convs: list[dict]) -> dict[str, dict] | None:
    """The best record per conv layer; None when some layer has no correct candidate."""
    best = {}
    for layer in dict.fromkeys(r["layer"] for r in convs):
        chosen = pick_best([r for r in convs if r["layer"] == layer])
        if chosen is None:
            return None
        best[layer] = chosen
    return best


# -- the whole network ---------------------------------------------------------------------------
def plan_from_best(config: BenchConfig, best: dict[str, dict]) -> ConvPlan:
    """The best variant per conv layer, as a network run takes them."""
    names = [layer.name for layer in config.network.conv_layers]
    return ConvPlan({n: get_variant(best[n]["variant"]) for n in names}, {n: best[n]["resolved_params"] for n in names})


def plan_of(cand: Candidate) -> ConvPlan:
    """A whole-network candidate (bench `networks:`) as a network run takes it: its variant at the
    first conv layer, which swallows the rest."""
    return ConvPlan({cand.layer: get_variant(cand.variant)}, {cand.layer: cand.resolved})


def _network_record(plan: ConvPlan, network, batch: int) -> dict:
    """A forward or end-to-end row before it is measured: the plan, its precision class and traffic."""
    names = {n: v.name for n, v in plan.variants.items()}
    return {"variant": variant_label(names), "variants": names, "params_by_layer": plan.params,
            "precision": loosest_precision(v.precision for v in plan.variants.values()),
            "unit": fastest_unit(v.unit for v in plan.variants.values()),
            "status": "failed", "error": None, "samples_ms": [],
            **network_traffic(network, batch, {n: v.fuses for n, v in plan.variants.items()},
                              {n: v.absorbs_input for n, v in plan.variants.items()})}


def measure_forward(gpu, timing: Timing, config: BenchConfig, plan: ConvPlan, inputs: Batch,
                    backend: Backend) -> dict:
    """The whole network with the plan's variants, images already on the device, one lane and stream."""
    network, stream, batch = config.network, timing.stream, timing.batch
    rec = _network_record(plan, network, batch)
    try:
        net = backend.network(gpu, network, inputs.weights, plan, 1, batch)
        x_dev = gpu.to_device(inputs.images, stream)
        logits_dev = gpu.alloc((batch, *network.layers[-1].out_shape), network.dtype)
        gpu.fill(logits_dev, 0xFF, stream)
        rec["samples_ms"] = event_samples(gpu, timing, lambda: net.enqueue(stream, net.lanes[0], x_dev, logits_dev, batch))
        logits = np.empty(logits_dev.shape, logits_dev.dtype)
        gpu.download(logits_dev, logits, stream)
        stream.sync()
        rec.update(check_logits(logits, inputs.reference, inputs.dataset.labels, inputs.idx,
                                plan.variants.values()).record())
    except Exception as e:
        rec.update(status="failed", error=failure_message(e))
    return rec


def measure_end_to_end(gpu, timing: Timing, config: BenchConfig, plan: ConvPlan, inputs: Batch,
                       backend: Backend, chunk_images: int | None = None) -> dict:
    """Host images -> host logits on the bench file's streams, chunked as jobs chunk (by
    `chunk_images` when given: a small batch's own), at the batch `inputs` holds, shipped in its
    input format (its network starts with the layer that makes the input from what was shipped).
    Events around the whole pass on streams[0]; with `graph` (the default) the pass is captured
    once as a CUDA graph and each timed pass is one replay of it."""
    network, e2e, batch = inputs.network, config.end_to_end, len(inputs.idx)
    chunks = pass_chunks(batch, e2e["streams"], chunk_images or e2e["chunk_images"])
    rec = {**_network_record(plan, network, batch), "batch": batch, "streams": e2e["streams"],
           "host_memory": e2e["host_memory"], "graph": e2e["graph"], "input_format": inputs.input_format.name,
           "chunks": len(chunks), "chunk_images": max(hi - lo for lo, hi in chunks),
           "tail_images": min(hi - lo for lo, hi in chunks)}
    try:
        streams = [gpu.stream() for _ in range(e2e["streams"])]
        net = backend.network(gpu, network, inputs.weights, plan, len(streams), rec["chunk_images"])
        buffers = pipeline_buffers(gpu, network, inputs.images, e2e["host_memory"], streams[0])
        # Each pass waits for its end: the logits are on the host only then, and the next pass reuses the buffers.
        timer = pipeline_timer(gpu, streams[0], e2e["graph"])

        def one_pass(marks: dict):
            start, _, _, end = pipeline_pass(gpu, net, streams, chunks, buffers)
            return start, end

        rec["samples_ms"] = sample(timer, one_pass, timing.rule(), warmup=timing.warmup).samples_ms
        rec.update(check_logits(np.array(buffers.logits_host), inputs.reference, inputs.dataset.labels, inputs.idx,
                                plan.variants.values()).record())
    except Exception as e:
        rec.update(status="failed", error=failure_message(e))
    return rec
