"""Runs a network on the GPU: conv layers with their variants, the rest with kernels/layers.cu.

`GpuNetwork` compiles and uploads once, owns one set of activation buffers per lane (one lane
per stream), and `enqueue` puts one chunk of images through every step on a stream, each step
enqueued by its layer kind (convsweep.model.layers). `pipeline_pass` runs a batch host to host in
chunks over several streams (convsweep.measure.timing's GraphReplay records one once, as a CUDA graph, to
replay). Timing is the caller's business: the runner only marks layers (NVTX ranges, optional events).
"""
from __future__ import annotations

import contextlib
import math
import re
import sys
import time
from contextlib import AbstractContextManager
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from convsweep.device.compile import LAYERS_SOURCE, CompiledModule, compile_all, compile_source, compile_variant
from convsweep.base.errors import CompileError, DeviceError, ShapeError
from convsweep.device.gpu import DeviceArray, Gpu, count_devices
from convsweep.model.layers import LAYER_KINDS
from convsweep.model.network import Network, Step
from convsweep.device.provenance import GpuMonitor
from .timing import FLUSH, Observer, gpu_observers
from convsweep.model.variants import ConvShape, Variant

try:
    import nvtx as _nvtx

    def nvtx_range(name: str):
        return _nvtx.annotate(name, domain="convsweep")
except ImportError:  # NVTX is optional outside nsys; ranges are only labels

    def nvtx_range(name: str):
        return contextlib.nullcontext()


class ConvOp:
    """One conv layer bound to a variant, its parameters and its compiled module."""

    def __init__(self, gpu: Gpu, variant: Variant, params: dict, layer_shape: ConvShape, arch: str | None = None):
        if gpu.compute_capability < variant.min_cc:  # before compiling: NVRTC would fail less clearly
            raise DeviceError(f"variant '{variant.name}' needs compute capability {variant.min_cc}, {gpu.name} has "
                              f"{gpu.compute_capability}")
        self.gpu, self.variant, self.params, self.layer_shape = gpu, variant, params, layer_shape
        self.build = compile_variant(variant, params, arch or gpu.arch, layer_shape)
        self.module = gpu.module(self.build, private=variant.constant_weights is not None)
        self.kernels = {name: gpu.kernel(self.module, name) for name in variant.kernel_names}
        self._plans: dict[ConvShape, tuple[list, int]] = {}  # shape -> (launches, workspace bytes)
        self.prepared: DeviceArray | None = None  # the weights in the variant's form (registry prepare)

    def _plan(self, shape: ConvShape) -> tuple[list, int]:
        """Launch geometry and workspace size, evaluated once per shape: enqueue is on the hot path
        (every chunk of every pass), and a pass reuses the same few chunk shapes."""
        if shape not in self._plans:
            self._plans[shape] = (self.variant.launch_plan(shape, self.params),
                                  self.variant.workspace_bytes(shape, self.params))
        return self._plans[shape]

    def bind_weights(self, k: DeviceArray, bias: DeviceArray, stream, tail: tuple[DeviceArray, ...] = ()) -> None:
        """Once per layer, before any launch: the weights every launch reads (variants that keep k
        in __constant__ get it copied there); `tail`: a fused network's later weights and biases,
        in layer order (FUSED_WEIGHTS). A variant with a registry `prepare` gets its prepared buffer
        written here, on `stream`, by its prepare launches (y, x and the workspace null, B 1, no absorbed
        layer's arguments: nothing of an input)."""
        self.k, self.bias, self.tail = k, bias, tail
        if self.variant.constant_weights:
            symbol = self.gpu.global_array(self.module, self.variant.constant_weights)
            if k.nbytes > symbol.nbytes:
                raise ShapeError(f"variant '{self.variant.name}': {k.nbytes} bytes of weights do not fit "
                                 f"__constant__ {self.variant.constant_weights} ({symbol.nbytes} bytes)")
            self.gpu.copy(symbol, k, stream)
        if self.variant.prepare:
            nbytes = self.variant.prepared_bytes(self.layer_shape, self.params)
            if self.prepared is None:  # bound again (new weights): the same shape, the same buffer
                self.prepared = self.gpu.alloc((nbytes,), np.uint8)
            args = self._args(np.uintp(0), np.uintp(0), self.layer_shape)
            for launch in self.variant.prepare_plan(self.layer_shape, self.params):
                self.gpu.launch(stream, self.kernels[launch.kernel], launch.grid, launch.block, launch.shared_bytes, *args)

    def workspace(self, shape: ConvShape) -> DeviceArray | None:
        """The scratch buffer one stream needs for `shape` (None when the variant needs none)."""
        nbytes = self._plan(shape)[1]
        return self.gpu.alloc((nbytes,), np.uint8) if nbytes else None

    def enqueue(self, stream, y: DeviceArray, x: DeviceArray, shape: ConvShape, workspace: DeviceArray | None = None,
                absorbed_args: tuple = ()):
        """Launch the variant's kernels on the bound weights: CONV_ARGS, then the workspace, prepared
        weights and pool arguments it declares, the tail's weights, and those of a first layer it absorbs (`absorbed_args`:
        x is then the shipped batch)."""
        launches, need = self._plan(shape)
        if self.variant.workspace and (workspace is None or workspace.nbytes < need):
            raise ShapeError(f"variant '{self.variant.name}': needs a {need}-byte workspace for {shape}")
        args = self._args(y.arg, x.arg, shape, workspace, absorbed_args)
        for launch in launches:
            self.gpu.launch(stream, self.kernels[launch.kernel], launch.grid, launch.block, launch.shared_bytes, *args)

    def _args(self, y: np.uintp, x: np.uintp, shape: ConvShape, workspace: DeviceArray | None = None,
              absorbed_args: tuple = ()) -> list:
        """The kernel arguments in common.cuh's order: CONV_ARGS, then what the registry entry declares."""
        args = [y, x, self.k.arg, self.bias.arg, *(np.int32(v) for v in (shape.B, shape.C, shape.M, shape.H, shape.W,
                                                                       shape.K, shape.S))]
        if self.variant.workspace:
            args.append(workspace.arg if workspace is not None else np.uintp(0))
        if self.variant.prepare:
            assert self.prepared is not None  # bind_weights made it
            args.append(self.prepared.arg)
        if self.variant.fuses_pool:
            args += [np.int32(shape.P), np.int32(shape.PS)]
        args += [w.arg for w in self.tail]
        return args + list(absorbed_args)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1, variant: str = "naive",
           params: dict | None = None, gpu: Gpu | None = None, pool: int | tuple[int, int] | None = None) -> np.ndarray:
    """One conv layer, y = conv(x, w) + b, with any registered variant; returns a new numpy array.

    Shapes are x [B, C, H, W], w [M, C, K, K], b [M]; float64 x runs in float64 (variants
    that list it), anything else in float32. A variant that fuses ReLU and max-pooling returns
    maxpool(relu(conv)), and needs `pool` (window, or (window, stride)). The output is poisoned
    (NaN) before the kernel runs, so an element a variant forgets to write cannot pass for a result.
    """
    from convsweep.model.reference import conv2d_reference, maxpool2d_reference
    from convsweep.model.variants import get_variant

    var = get_variant(variant)
    dtype = np.float64 if np.asarray(x).dtype == np.float64 else np.float32
    x, w, b = (np.ascontiguousarray(a, dtype=dtype) for a in (x, w, b))
    if x.ndim != 4 or w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[1] != x.shape[1] or b.shape != (w.shape[0],):
        raise ShapeError(f"conv2d: expected x [B,C,H,W], w [M,C,K,K], b [M]; got {x.shape}, {w.shape}, {b.shape}")
    size, pool_stride = (pool, pool) if isinstance(pool, int) else (pool or (0, 0))
    shape = ConvShape(B=x.shape[0], C=x.shape[1], M=w.shape[0], H=x.shape[2], W=x.shape[3], K=w.shape[2], S=stride,
                      P=size, PS=pool_stride, dtype=np.dtype(dtype).name)
    resolved = var.resolve_params(params, f"conv2d({variant}).params")
    if var.is_cpu:
        y = conv2d_reference(x, w, b, stride)
        return maxpool2d_reference(np.maximum(y, 0), size, pool_stride) if size else y
    var.check_shape(shape, resolved)
    owns = gpu is None
    gpu = gpu or Gpu()
    try:
        with gpu.scope():  # the call's stream and buffers go when it returns: a caller's Gpu does not fill up
            return _conv2d_on(gpu, var, resolved, shape, x, w, b, dtype)
    finally:
        if owns:
            gpu.close()


def _conv2d_on(gpu, var, resolved, shape, x, w, b, dtype) -> np.ndarray:
    stream = gpu.stream()
    op = ConvOp(gpu, var, resolved, shape)
    dx, dw, db = (gpu.to_device(a, stream) for a in (x, w, b))
    op.bind_weights(dw, db, stream)
    dy = gpu.alloc(shape.out_shape, dtype)
    gpu.fill(dy, 0xFF, stream)
    op.enqueue(stream, dy, dx, shape, op.workspace(shape))
    y = np.empty(dy.shape, dtype)
    gpu.download(dy, y, stream)
    stream.sync()
    return y


@dataclass
class Lane:
    """Buffers for one stream: every layer's output for up to `capacity` images, and the conv
    workspaces (im2col columns, half copies, ...) of the variants that need one."""

    capacity: int
    outputs: dict[str, DeviceArray] = field(default_factory=dict)
    workspaces: dict[str, DeviceArray | None] = field(default_factory=dict)


@dataclass(frozen=True)
class ConvPlan:
    """What a network run is built from: each conv layer's variant and its resolved tunables."""

    variants: dict[str, Variant]
    params: dict[str, dict]
    arch: str | None = None  # NVRTC's target; None: the GPU's own


# How long a held stream waits for the host (GpuNetwork.hold): far more than enqueuing a pass takes.
HOLD_TIMEOUT_NS = 100_000_000


class GpuNetwork:
    """A network compiled, loaded and given its weights on one GPU, with `lanes` sets of buffers
    for up to `capacity` images each. Setting up is synchronous: it ends with the weights on the GPU."""

    def __init__(self, gpu: Gpu, network: Network, weights: dict[str, np.ndarray], plan: ConvPlan, lanes: int,
                 capacity: int):
        variants, params = plan.variants, plan.params
        stream = gpu.stream()
        self.gpu, self.network = gpu, network
        self.dtype = np.dtype(network.dtype)
        self.layers_build = compile_source(LAYERS_SOURCE, "layers",
                                           {"CONV_T": "double"} if network.dtype == "float64" else {},
                                           plan.arch or gpu.arch)
        layers_module = gpu.module(self.layers_build)
        self.layer_kernels = {n: gpu.kernel(layers_module, n) for kind in LAYER_KINDS.values() for n in kind.kernels}
        self._hold_kernel = gpu.kernel(layers_module, "hold_stream")
        self.steps = network.steps({name: var.fuses for name, var in variants.items()},
                                   {name: var.absorbs_input for name, var in variants.items()})
        self.convs: dict[str, ConvOp] = {}
        self.builds: list[CompiledModule] = [self.layers_build]
        for step in self.steps:
            if not step.layer.is_conv:
                continue
            var = variants[step.layer.name]
            for b in (1, capacity):  # refuse unsupported shapes before anything is allocated
                var.check_shape(self.shape(step, b), params[step.layer.name])
            op = ConvOp(gpu, var, params[step.layer.name], self.shape(step, 1), plan.arch)
            self.builds.append(op.build)
            self.convs[step.layer.name] = op
        self.weights = {name: gpu.to_device(array.astype(self.dtype), stream) for name, array in weights.items()}
        for step in self.steps:
            if step.layer.is_conv:
                name = step.layer.name
                tail = tuple(self.weights[f"{layer.name}.{part}"] for layer in self.shape(step, 1).tail
                             for part in layer.kind.weights(layer))
                self.convs[name].bind_weights(self.weights[f"{name}.weight"], self.weights[f"{name}.bias"], stream, tail)
        self.lanes = [self._lane(capacity) for _ in range(lanes)]
        stream.sync()

    def shape(self, step: Step, batch: int) -> ConvShape:
        return self.network.step_shape(step, batch)

    def hold(self, stream, flag: np.ndarray, timeout_ns: int = HOLD_TIMEOUT_NS) -> None:
        """Hold `stream` until the host sets flag[0] (an int32 in pinned host memory) to nonzero: the work
        enqueued meanwhile then runs back to back, whatever the host's launch rate (nvbench's blocking
        kernel). It lets go by itself after `timeout_ns`."""
        flag[0] = 0
        self.gpu.launch(stream, self._hold_kernel, 1, 1, 0, np.intp(flag.ctypes.data), np.int64(timeout_ns))

    def _lane(self, capacity: int) -> Lane:
        lane = Lane(capacity)
        for step in self.steps:
            if step.layer.kind.owns_output:
                lane.outputs[step.layer.name] = self.gpu.alloc((capacity,) + tuple(step.last.out_shape), self.dtype)
            if step.layer.is_conv:
                lane.workspaces[step.layer.name] = self.convs[step.layer.name].workspace(self.shape(step, capacity))
        return lane

    def enqueue(self, stream, lane: Lane, x: DeviceArray, logits: DeviceArray, n: int, events: dict | None = None,
                flush: Callable[[object], None] | None = None):
        """Run n images from x through the network into logits on `stream`.

        With `events`, a (start, end) pair of timing events is appended per conv layer. With
        `flush` (Gpu.l2_flusher), L2 is written over before each conv layer, outside its events;
        the flushes get event pairs of their own under FLUSH, so a pass's time can leave them out.
        """
        cur, last = x.rows(0, n), self.steps[-1]
        for step in self.steps:
            name = step.layer.name
            if flush is not None and step.layer.is_conv:
                with nvtx_range(FLUSH):
                    begin = self.gpu.event(stream) if events is not None else None
                    flush(stream)
                    if events is not None:
                        events.setdefault(FLUSH, []).append((begin, self.gpu.event(stream)))
            with nvtx_range(name):
                out = None
                if step.layer.kind.owns_output:
                    out = logits.rows(0, n) if step is last else lane.outputs[name].rows(0, n)
                timed = events is not None and step.layer.is_conv
                start = self.gpu.event(stream) if timed else None
                cur = step.layer.kind.enqueue(self, stream, step, cur, out, lane)
                if timed:
                    cast(dict, events).setdefault(name, []).append((start, self.gpu.event(stream)))  # timed: events
        if cur.ptr != logits.ptr:  # a network that ends in a layer without an output of its own
            self.gpu.copy(logits.rows(0, n), cur, stream)


# NVRTC's `file(line): ` where a line of its message starts, as `file:line: `: the form editors and terminals open.
NVRTC_WHERE = re.compile(r"^(\S+)\((\d+)\): ", re.M)


@contextlib.contextmanager
def compile_all_telling(requests: list, arch: str, workers: int | None = None):
    """compile_all (convsweep.device.compile), and once its builds are waited for, NVRTC's whole message for each build that
    failed, on stderr (the job's log): a setting stores the compiler's first error alone, the log keeps the rest."""
    with compile_all(requests, arch, workers) as pending:
        yield _TellingBuilds(pending)


class _TellingBuilds:
    """compile_all's PendingBuilds, whose first wait also tells the compile errors."""

    def __init__(self, pending):
        self._pending, self._told = pending, False

    def wait(self) -> dict:
        results = self._pending.wait()
        if not self._told:
            self._told = True
            tell_compile_errors({request: result for request, result in results.items()
                                 if isinstance(result, CompileError)}, sys.stderr)
        return results


def tell_compile_errors(failed: dict, out) -> None:
    """Each distinct compiler message of `failed` (BuildRequest -> CompileError) once, under a line naming the build
    (its name and macros) and how many more said the same; its lines indented, each place as file:line."""
    said: dict[str, list] = {}
    for request, error in failed.items():
        said.setdefault(error.log or str(error), []).append(request)
    for message, requests in said.items():
        first, others = requests[0], len(requests) - 1
        macros = ",".join(f"{k}={v}" for k, v in first.macros) or "no macros"
        more = f"; {others} more build{'s' * (others != 1)} said the same" if others else ""
        lines = [line.rstrip() for line in NVRTC_WHERE.sub(r"\1:\2: ", message).splitlines()]
        print(f"NVRTC's whole message for {first.name} ({macros}{more}):", file=out)
        print("\n".join(f"  {line}" if line else "" for line in lines), file=out, flush=True)


@dataclass(frozen=True)
class Backend:
    """What builds, runs and watches kernels: the GPU, a conv layer's op, a whole network, the parallel
    compile of a job's builds, NVML's monitor of the GPU and the host clock around its passes. Jobs and
    the bench take one, so a test hands in stand-ins (numpy, a scripted counter, a steady clock)."""

    gpu: Callable[[], Gpu] = Gpu
    conv_op: Callable[..., ConvOp] = ConvOp
    network: Callable[..., GpuNetwork] = GpuNetwork
    # compile_all, with each failed build's whole message in the job log (a fake's builds say nothing)
    compile_all: Callable[..., AbstractContextManager] = compile_all_telling
    monitor: Callable[..., GpuMonitor] = GpuMonitor  # (CUDA uuid, PCI bus id) -> a context manager
    clock: Callable[[], float] = time.perf_counter  # seconds; what the stopping rule and the energy window read
    # (gpu, monitor, run spec, clock) -> what watches a setting's timed passes (timing.gpu_observers)
    observers: Callable[..., list[Observer]] = gpu_observers
    devices: Callable[[], int] = count_devices  # GPUs the driver sees; MachineError (no GPU or driver) where none
    # (gpu, monitor) -> the device's peak rates as a result file keeps them (convsweep.device.peaks), or None
    peaks: Callable[..., dict | None] = lambda gpu, monitor: device_peaks(gpu, monitor)


def device_peaks(gpu: Gpu, monitor) -> dict:
    """The peak rates a job's floors are held to, from the device's attributes and NVML."""
    from convsweep.device.peaks import peaks_of

    return peaks_of(gpu, monitor).to_json()


def pass_chunks(batch: int, streams: int, chunk_images: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) image ranges of one pass: `chunk_images` each, or by default one chunk for one
    stream (no overlap) and four per stream otherwise, so each stream's copies can hide others' kernels."""
    size = chunk_images or math.ceil(batch / (1 if streams == 1 else min(batch, 4 * streams)))
    return [(lo, min(lo + size, batch)) for lo in range(0, batch, size)]


@dataclass(frozen=True)
class PipelineBuffers:
    """A pipelined pass's images and logits, on the host and on the device."""

    x_host: np.ndarray
    x_dev: DeviceArray
    logits_host: np.ndarray
    logits_dev: DeviceArray


def pipeline_buffers(gpu: Gpu, network, images: np.ndarray, host_memory: str, stream) -> PipelineBuffers:
    """Host and device buffers of a pipeline pass: the images copied into host memory of the given
    kind, logits poisoned (NaN on the host, 0xFF bytes on the device) so an unwritten one shows."""
    dtype = np.dtype(network.dtype)
    x_host = gpu.host_array(images.shape, network.shipped_dtype, host_memory)  # as the input's format ships it
    x_host[...] = images
    logits_host = gpu.host_array((len(images), *network.layers[-1].out_shape), dtype, host_memory)
    x_dev = gpu.alloc(x_host.shape, x_host.dtype)
    buffers = PipelineBuffers(x_host, x_dev, logits_host, gpu.alloc(logits_host.shape, dtype))
    poison_logits(gpu, buffers, stream)
    return buffers


def poison_logits(gpu: Gpu, buffers: PipelineBuffers, stream) -> None:
    """NaN on the host and 0xFF bytes (NaN) on the device: logits no pass wrote cannot pass a check."""
    buffers.logits_host[...] = np.nan
    gpu.fill(buffers.logits_dev, 0xFF, stream)
    stream.sync()


def pipeline_pass(gpu: Gpu, net: GpuNetwork, streams: list, chunks: list[tuple[int, int]], buffers: PipelineBuffers,
                  marks: dict | None = None, flush: Callable[[object], None] | None = None):
    """Enqueue one pass of a batch, host to host: chunk i goes H2D -> every layer -> D2H on
    streams[i % len(streams)] with lane i % len(streams) of `net`.

    Returns the timing events (start, h2d_end, d2h_start, end): `start` is on streams[0] before
    the first H2D (every other stream waits for it), `end` on streams[0] after it waited for every
    stream's last D2H; h2d_end and d2h_start belong to the last chunk. Nothing is synchronized.
    `marks` collects per-conv-layer event pairs and `flush` writes over L2 before each conv layer
    (GpuNetwork.enqueue).
    """
    start = gpu.event(streams[0])
    for s in streams[1:]:
        s.wait(start)
    h2d_end = d2h_start = None
    x_host, x_dev, logits_host, logits_dev = buffers.x_host, buffers.x_dev, buffers.logits_host, buffers.logits_dev
    for i, (lo, hi) in enumerate(chunks):
        lane = i % len(streams)
        s = streams[lane]
        with nvtx_range(f"chunk {i}"):
            with nvtx_range("h2d"):
                gpu.upload(x_host[lo:hi], x_dev.rows(lo, hi), s)
            h2d_end = gpu.event(s)
            net.enqueue(s, net.lanes[lane], x_dev.rows(lo, hi), logits_dev.rows(lo, hi), hi - lo, marks, flush)
            d2h_start = gpu.event(s)
            with nvtx_range("d2h"):
                gpu.download(logits_dev.rows(lo, hi), logits_host[lo:hi], s)
    for s in streams[1:]:
        streams[0].wait(gpu.event(s))
    end = gpu.event(streams[0])
    return start, h2d_end, d2h_start, end
