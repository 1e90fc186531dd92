"""Runs a network on the GPU: conv layers with their variants, the rest with kernels/layers.cu.

`GpuNetwork` compiles and uploads once, owns one set of activation buffers per lane (one lane
per stream), and `enqueue` puts one chunk of images through every layer on a stream. Timing
is the caller's business: `enqueue` only marks layers (NVTX ranges, optional events).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from .compile import LAYERS_SOURCE, Build, compile_source, compile_variant
from .errors import ShapeError
from .gpu import DeviceArray, Gpu
from .variants import ConvShape, Variant

try:
    import nvtx as _nvtx

    def nvtx_range(name: str):
        return _nvtx.annotate(name, domain="convsweep")
except ImportError:  # NVTX is optional outside nsys; ranges are only labels

    def nvtx_range(name: str):
        return contextlib.nullcontext()


_THREADS = 256
_DENSE_TILE = 32  # kernels/layers.cu DENSE_TILE_B and DENSE_TILE_N: images x outputs per block
_DENSE_THREADS = 256  # kernels/layers.cu DENSE_THREADS: two halves of 128 threads splitting k


def enqueue_dense(gpu: Gpu, kernel, stream, y: DeviceArray, x: DeviceArray, w: DeviceArray, bias: DeviceArray,
                  n: int, relu: bool = False) -> None:
    """y[:n] = x[:n] @ w.T + bias (ReLU'd with `relu`) with layers.cu's `dense`, a block per tile of
    _DENSE_TILE images x _DENSE_TILE outputs."""
    out_features, in_features = w.shape
    grid = ((n + _DENSE_TILE - 1) // _DENSE_TILE, (out_features + _DENSE_TILE - 1) // _DENSE_TILE)
    gpu.launch(stream, kernel, grid, _DENSE_THREADS, 0, y.arg, x.arg, w.arg, bias.arg,
               np.int32(n), np.int32(in_features), np.int32(out_features), np.int32(relu))


def conv_shape(layer, batch: int, dtype: str = "float32", fused: tuple = ()) -> ConvShape:
    """The kernel's problem for a conv layer and the layers fused into it (a max-pool sets P, PS)."""
    c, h, w = layer.in_shape
    pool = next((f for f in fused if f.type == "maxpool2d"), None)
    return ConvShape(B=batch, C=c, M=layer.out_channels, H=h, W=w, K=layer.kernel, S=layer.stride,
                     P=pool.size if pool else 0, PS=pool.stride if pool else 0, dtype=dtype)


def plan_steps(network, fuses: dict[str, tuple]) -> list[tuple]:
    """The launched steps, (layer, layers it stands for), in order: a conv variant fusing
    `fuses[name]` (relu, maxpool) swallows those layers, and a dense layer the relu right after it."""
    steps, skip = [], 0
    for layer in network.layers:
        if skip:
            skip -= 1
            continue
        if layer.type == "conv2d":
            fused = network.fused_layers(layer.name, tuple(fuses.get(layer.name, ())))
        else:
            fused = network.relu_after(layer.name) if layer.type == "dense" else ()
        steps.append((layer, fused))
        skip = len(fused)
    return steps


class ConvOp:
    """One conv layer bound to a variant, its parameters and its compiled module."""

    def __init__(self, gpu: Gpu, variant: Variant, params: dict, layer_shape: ConvShape):
        self.gpu, self.variant, self.params = gpu, variant, params
        self.build = compile_variant(variant, params, gpu.arch, layer_shape)
        self.module = gpu.module(self.build, private=variant.constant_weights is not None)
        self.kernels = {name: gpu.kernel(self.module, name) for name in variant.kernel_names}
        self._plans: dict[ConvShape, tuple[list, int]] = {}  # shape -> (launches, workspace bytes)

    def _plan(self, shape: ConvShape) -> tuple[list, int]:
        """Launch geometry and workspace size, evaluated once per shape: enqueue is on the hot path
        (every chunk of every pass), and a pass reuses the same few chunk shapes."""
        if shape not in self._plans:
            self._plans[shape] = (self.variant.launch_plan(shape, self.params),
                                  self.variant.workspace_bytes(shape, self.params))
        return self._plans[shape]

    def bind_weights(self, k: DeviceArray, stream) -> None:
        """Once per layer, before any launch: variants that keep k in __constant__ get it there."""
        if self.variant.constant_weights:
            symbol = self.gpu.global_array(self.module, self.variant.constant_weights)
            if k.nbytes > symbol.nbytes:
                raise ShapeError(f"variant '{self.variant.name}': {k.nbytes} bytes of weights do not fit "
                                 f"__constant__ {self.variant.constant_weights} ({symbol.nbytes} bytes)")
            self.gpu.copy(symbol, k, stream)

    def workspace(self, shape: ConvShape) -> DeviceArray | None:
        """The scratch buffer one stream needs for `shape` (None when the variant needs none)."""
        nbytes = self._plan(shape)[1]
        return self.gpu.alloc((nbytes,), np.uint8) if nbytes else None

    def enqueue(self, stream, y: DeviceArray, x: DeviceArray, k: DeviceArray, bias: DeviceArray, shape: ConvShape,
                workspace: DeviceArray | None = None):
        """Launch the variant's kernels: CONV_ARGS, then the workspace and pool arguments it declares."""
        args = [y.arg, x.arg, k.arg, bias.arg, *(np.int32(v) for v in (shape.B, shape.C, shape.M, shape.H, shape.W,
                                                                       shape.K, shape.S))]
        launches, need = self._plan(shape)
        if self.variant.workspace:
            if workspace is None or workspace.nbytes < need:
                raise ShapeError(f"variant '{self.variant.name}': needs a {need}-byte workspace for {shape}")
            args.append(workspace.arg)
        if self.variant.fuses_pool:
            args += [np.int32(shape.P), np.int32(shape.PS)]
        for launch in launches:
            self.gpu.launch(stream, self.kernels[launch.kernel], launch.grid, launch.block, launch.shared_bytes, *args)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1, variant: str = "naive",
           params: dict | None = None, gpu: Gpu | None = None, pool: int | tuple[int, int] | None = None) -> np.ndarray:
    """One conv layer, y = conv(x, w) + b, with any registered variant; returns a new numpy array.

    Shapes are x [B, C, H, W], w [M, C, K, K], b [M]; float64 x runs in float64 (variants
    that list it), anything else in float32. A variant that fuses ReLU and max-pooling returns
    maxpool(relu(conv)), and needs `pool` (window, or (window, stride)). The output is poisoned
    (NaN) before the kernel runs, so an element a variant forgets to write cannot pass for a result.
    """
    from .network import conv2d_reference, maxpool2d_reference
    from .variants import get_variant

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
        stream = gpu.stream()
        op = ConvOp(gpu, var, resolved, shape)
        dx, dw, db = (gpu.to_device(a, stream) for a in (x, w, b))
        op.bind_weights(dw, stream)
        dy = gpu.alloc(shape.out_shape, dtype)
        gpu.fill(dy, 0xFF, stream)
        op.enqueue(stream, dy, dx, dw, db, shape, op.workspace(shape))
        y = np.empty(dy.shape, dtype)
        gpu.download(dy, y, stream)
        stream.sync()
        return y
    finally:
        if owns:
            gpu.close()


@dataclass
class Lane:
    """Buffers for one stream: every layer's output for up to `capacity` images, and the conv
    workspaces (im2col columns, half copies, ...) of the variants that need one."""

    capacity: int
    outputs: dict[str, DeviceArray] = field(default_factory=dict)
    workspaces: dict[str, DeviceArray | None] = field(default_factory=dict)


class GpuNetwork:
    def __init__(self, gpu: Gpu, network, weights: dict[str, np.ndarray], variants: dict[str, Variant],
                 params: dict[str, dict], lanes: int, capacity: int, stream):
        self.gpu, self.network = gpu, network
        self.dtype = np.dtype(network.dtype)
        self.layers_build = compile_source(LAYERS_SOURCE, "layers",
                                           {"CONV_T": "double"} if network.dtype == "float64" else {}, gpu.arch)
        layers_module = gpu.module(self.layers_build)
        self.layer_kernels = {n: gpu.kernel(layers_module, n) for n in ("relu_inplace", "maxpool2d", "dense")}
        self.steps = plan_steps(network, {name: var.fuses for name, var in variants.items()})
        self.convs: dict[str, ConvOp] = {}
        self.builds: list[Build] = [self.layers_build]
        for layer, fused in self.steps:
            if layer.type != "conv2d":
                continue
            var = variants[layer.name]
            for b in (1, capacity):  # refuse unsupported shapes before anything is allocated
                var.check_shape(self.shape(layer, fused, b), params[layer.name])
            op = ConvOp(gpu, var, params[layer.name], self.shape(layer, fused, 1))
            self.builds.append(op.build)
            self.convs[layer.name] = op
        self.weights = {name: gpu.to_device(array.astype(self.dtype), stream) for name, array in weights.items()}
        for name, op in self.convs.items():
            op.bind_weights(self.weights[f"{name}.weight"], stream)
        self.lanes = [self._lane(capacity) for _ in range(lanes)]

    def shape(self, layer, fused, batch: int) -> ConvShape:
        return conv_shape(layer, batch, self.network.dtype, fused)

    def _lane(self, capacity: int) -> Lane:
        lane = Lane(capacity)
        for layer, fused in self.steps:
            last = fused[-1] if fused else layer
            if layer.type not in ("relu", "flatten"):  # in place, or a view of the previous output
                lane.outputs[layer.name] = self.gpu.alloc((capacity,) + tuple(last.out_shape), self.dtype)
            if layer.type == "conv2d":
                lane.workspaces[layer.name] = self.convs[layer.name].workspace(self.shape(layer, fused, capacity))
        return lane

    def enqueue(self, stream, lane: Lane, x: DeviceArray, logits: DeviceArray, n: int, events: dict | None = None):
        """Run n images from x through the network into logits on `stream`.

        With `events`, a (start, end) pair of timing events is appended per conv layer.
        """
        cur = x.rows(0, n)
        for layer, fused in self.steps:
            with nvtx_range(layer.name):
                if layer.type == "conv2d":
                    out = lane.outputs[layer.name].rows(0, n)
                    start = self.gpu.event(stream) if events is not None else None
                    self.convs[layer.name].enqueue(stream, out, cur, self.weights[f"{layer.name}.weight"],
                                                   self.weights[f"{layer.name}.bias"], self.shape(layer, fused, n),
                                                   lane.workspaces[layer.name])
                    if events is not None:
                        events.setdefault(layer.name, []).append((start, self.gpu.event(stream)))
                    cur = out
                elif layer.type == "relu":
                    count = int(np.prod(cur.shape))
                    self.gpu.launch(stream, self.layer_kernels["relu_inplace"], (count + _THREADS - 1) // _THREADS,
                                    _THREADS, 0, cur.arg, np.int64(count))
                elif layer.type == "maxpool2d":
                    out = lane.outputs[layer.name].rows(0, n)
                    c, h, w = layer.in_shape
                    count = int(np.prod(out.shape))
                    self.gpu.launch(stream, self.layer_kernels["maxpool2d"], (count + _THREADS - 1) // _THREADS,
                                    _THREADS, 0, out.arg, cur.arg, np.int32(n * c), np.int32(h), np.int32(w),
                                    np.int32(layer.size), np.int32(layer.stride))
                    cur = out
                elif layer.type == "flatten":
                    cur = DeviceArray(cur.ptr, (n, int(np.prod(cur.shape[1:]))), cur.dtype)
                elif layer.type == "dense":
                    is_last = layer is self.steps[-1][0]
                    out = logits.rows(0, n) if is_last else lane.outputs[layer.name].rows(0, n)
                    enqueue_dense(self.gpu, self.layer_kernels["dense"], stream, out, cur,
                                  self.weights[f"{layer.name}.weight"], self.weights[f"{layer.name}.bias"], n,
                                  relu=bool(fused))
                    cur = out
                else:
                    raise ShapeError(f"{self.network.path}: layer '{layer.name}' has type '{layer.type}' the GPU runner does not know")
        if cur.ptr != logits.ptr:  # networks that do not end in a dense layer
            from cuda.bindings import driver

            driver.cuMemcpyDtoDAsync(logits.ptr, cur.ptr, logits.rows(0, n).nbytes, int(stream.handle))


def pipeline_buffers(gpu: Gpu, network, images: np.ndarray, host_memory: str, stream):
    """Host and device buffers of a pipeline pass: the images copied into host memory of the given
    kind, logits poisoned (NaN on the host, 0xFF bytes on the device) so an unwritten one shows.
    Returns (x_host, x_dev, logits_host, logits_dev)."""
    dtype = np.dtype(network.dtype)
    x_host = gpu.host_array(images.shape, dtype, host_memory)
    x_host[...] = images
    logits_host = gpu.host_array((len(images), *network.layers[-1].out_shape), dtype, host_memory)
    logits_host[...] = np.nan
    x_dev = gpu.alloc(x_host.shape, dtype)
    logits_dev = gpu.alloc(logits_host.shape, dtype)
    gpu.fill(logits_dev, 0xFF, stream)
    stream.sync()
    return x_host, x_dev, logits_host, logits_dev


def pipeline_pass(gpu: Gpu, net: GpuNetwork, streams: list, chunks: list[tuple[int, int]], x_host: np.ndarray,
                  x_dev: DeviceArray, logits_host: np.ndarray, logits_dev: DeviceArray, marks: dict | None = None):
    """Enqueue one pass of a batch, host to host: chunk i goes H2D -> every layer -> D2H on
    streams[i % len(streams)] with lane i % len(streams) of `net`.

    Returns the timing events (start, h2d_end, d2h_start, end): `start` is on streams[0] before
    the first H2D (every other stream waits for it), `end` on streams[0] after it waited for every
    stream's last D2H; h2d_end and d2h_start belong to the last chunk. Nothing is synchronized.
    `marks` collects per-conv-layer event pairs (GpuNetwork.enqueue).
    """
    start = gpu.event(streams[0])
    for s in streams[1:]:
        s.wait(start)
    h2d_end = d2h_start = None
    for i, (lo, hi) in enumerate(chunks):
        lane = i % len(streams)
        s = streams[lane]
        with nvtx_range(f"chunk {i}"):
            with nvtx_range("h2d"):
                gpu.upload(x_host[lo:hi], x_dev.rows(lo, hi), s)
            h2d_end = gpu.event(s)
            net.enqueue(s, net.lanes[lane], x_dev.rows(lo, hi), logits_dev.rows(lo, hi), hi - lo, marks)
            d2h_start = gpu.event(s)
            with nvtx_range("d2h"):
                gpu.download(logits_dev.rows(lo, hi), logits_host[lo:hi], s)
    for s in streams[1:]:
        streams[0].wait(gpu.event(s))
    end = gpu.event(streams[0])
    return start, h2d_end, d2h_start, end
