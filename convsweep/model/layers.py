"""The layer types a network may hold, as one table: adding a type touches this file (and, for
the GPU, kernels/layers.cu) only.

Each `LayerKind` says everything convsweep does with its type: the keys a network file gives it
and the shape it infers, its weights, its float64 reference on the host and on the GPU (the truth
every timed pass is checked against: kernels/truth.cu), the bytes and FLOPs one launch moves, how the
GPU runner enqueues it, and its PyTorch form (for the cuDNN comparison). The GPU and PyTorch entries
receive the runner, the truth or torch as arguments, so this module imports none of them.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from convsweep.base.errors import ConfigError
from .reference import conv2d_reference, maxpool2d_reference

THREADS = 256  # threads per block of layers.cu's elementwise kernels (relu, max-pool)
DENSE_TILE = 32  # kernels/layers.cu DENSE_TILE_B and DENSE_TILE_N: images x outputs per block
DENSE_THREADS = 256  # kernels/layers.cu DENSE_THREADS: two halves of 128 threads splitting k
TRUTH_CONV_COLUMNS = 2  # kernels/truth.cu conv2d_f64_<group>x<columns>_k<size>: neighbouring positions a thread keeps
TRUTH_CONV_GROUPS = (16, 8, 4, 2, 1)  # its groups of output channels, the widest that divides M is taken
TRUTH_CONV_SIZES = (5, 7)  # the kernel sizes it has unrolled; any other size runs the k0 kernel


@dataclass(frozen=True)
class Layer:
    """One layer with its inferred shapes (per image, without the batch axis)."""

    name: str
    type: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    out_channels: int | None = None
    kernel: int | None = None
    stride: int | None = None
    size: int | None = None
    out_features: int | None = None
    divisor: float | None = None  # convert and upsample: y = x / divisor (255: bytes onto [0, 1])

    @property
    def kind(self) -> LayerKind:
        return LAYER_KINDS[self.type]

    @property
    def is_conv(self) -> bool:
        """Conv layers are what variants implement and what op times are measured for."""
        return self.type == "conv2d"


@dataclass(frozen=True)
class LayerKind:
    required: frozenset[str]  # keys a network file must give a layer of this type (besides name, type)
    optional: frozenset[str]
    infer: Callable[[str, str, tuple, dict, str], Layer]  # (name, type, in_shape, keys, where) -> Layer
    weights: Callable[[Layer], dict[str, tuple[int, ...]]]  # {"weight": shape, "bias": shape} or {}
    reference: Callable[[Layer, dict, np.ndarray], np.ndarray]  # (layer, weights by key, x) -> y in x's dtype
    traffic: Callable[[Any, Any, int, int], tuple[int, int]]  # (network, step, batch, itemsize) -> (bytes, flops)
    enqueue: Callable[..., Any]  # (runner, stream, step, x, out, lane) -> the step's output; x holds the chunk's images
    torch: Callable[[Any, Layer, dict, Any], Any]  # (torch, layer, weights by key, h) -> h
    # (truth, stream, layer, x, y) -> the output in float64 (y, or x where it works in place): convsweep.device.truth
    truth: Callable[..., Any]
    kernels: tuple[str, ...] = ()  # the kernels/layers.cu functions its enqueue launches
    owns_output: bool = True  # needs an output buffer per lane (relu works in place, flatten is a view)
    fuse_name: str | None = None  # what a conv variant's `fuses` calls this layer when it computes it
    absorbs_relu: bool = False  # its GPU kernel applies a relu that follows it in the epilogue
    # A network's first layer that a conv variant may compute itself (registry absorbs_input): the
    # arguments that variant's kernel takes for it, after all its others (None: no variant may).
    absorbed_args: Callable[[Layer], tuple] | None = None

    @property
    def absorbable(self) -> bool:
        return self.absorbed_args is not None

    @property
    def makes_input(self) -> bool:
        """Whether it makes the network's input from what was shipped (convert, upsample): the float64
        truth then starts with it, on the shipped elements, where it otherwise casts the input first."""
        return self.absorbed_args is not None


def _spatial(in_shape: tuple[int, ...], where: str, kind: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ConfigError(f"{where}: {kind} expected a [C, H, W] input, got shape {list(in_shape)}")
    return in_shape


def _size(shape) -> int:
    return math.prod(shape)


# -- conv2d ---------------------------------------------------------------------------------------
def _conv_infer(name, kind, in_shape, values, where) -> Layer:
    _, h, w = _spatial(in_shape, where, kind)
    k, s = values["kernel"], values.get("stride", 1)
    if k > h or k > w:
        raise ConfigError(f"{where}.kernel: expected at most the input size {h}x{w}, got {k}")
    out = (values["out_channels"], (h - k) // s + 1, (w - k) // s + 1)
    return Layer(name, kind, in_shape, out, out_channels=values["out_channels"], kernel=k, stride=s)


def _conv_traffic(network, step, batch, itemsize):
    shape = network.step_shape(step, batch)
    return shape.min_bytes, shape.flops


def _conv_enqueue(runner, stream, step, x, out, lane):
    """The conv's variant on x: the shipped batch itself where the step absorbed the network's first layer."""
    name, absorbed = step.layer.name, step.absorbed
    runner.convs[name].enqueue(stream, out, x, runner.shape(step, x.shape[0]), lane.workspaces[name],
                               absorbed.kind.absorbed_args(absorbed) if absorbed else ())
    return out


def _conv_truth(truth, stream, layer, x, y):
    """conv2d_f64 with the widest group of output channels a thread can keep that divides M (TRUTH_CONV_GROUPS),
    TRUTH_CONV_COLUMNS neighbouring positions of a row, and the layer's kernel size unrolled where it has one."""
    n, (c, h, w), m = x.shape[0], layer.in_shape, layer.out_channels
    group = next(g for g in TRUTH_CONV_GROUPS if m % g == 0)
    (_, h_out, w_out), columns = layer.out_shape, TRUTH_CONV_COLUMNS
    size = layer.kernel if layer.kernel in TRUTH_CONV_SIZES else 0
    truth.launch(stream, f"conv2d_f64_{group}x{columns}_k{size}", n * (m // group) * h_out * -(-w_out // columns),
                 y.arg, x.arg, truth.weight(f"{layer.name}.weight").arg, truth.weight(f"{layer.name}.bias").arg,
                 *(np.int32(v) for v in (n, c, m, h, w, layer.kernel, layer.stride)))
    return y


CONV2D = LayerKind(
    required=frozenset({"out_channels", "kernel"}), optional=frozenset({"stride"}), infer=_conv_infer,
    # A conv layer has its out_channels, kernel and stride (_conv_infer).
    weights=lambda layer: cast(dict[str, tuple[int, ...]],
                               {"weight": (layer.out_channels, layer.in_shape[0], layer.kernel, layer.kernel),
                                "bias": (layer.out_channels,)}),
    reference=lambda layer, weights, x: conv2d_reference(x, weights[f"{layer.name}.weight"],
                                                         weights[f"{layer.name}.bias"], cast(int, layer.stride)),
    traffic=_conv_traffic, enqueue=_conv_enqueue,
    torch=lambda torch, layer, weights, h: torch.nn.functional.conv2d(
        h, weights[f"{layer.name}.weight"], weights[f"{layer.name}.bias"], stride=layer.stride),
    truth=_conv_truth)


# -- relu -----------------------------------------------------------------------------------------
def _relu_enqueue(runner, stream, step, x, out, lane):
    count = _size(x.shape)
    runner.gpu.launch(stream, runner.layer_kernels["relu_inplace"], (count + THREADS - 1) // THREADS, THREADS, 0,
                      x.arg, np.int64(count))
    return x


def _relu_truth(truth, stream, layer, x, y):
    count = _size(x.shape)
    truth.launch(stream, "relu_f64", count, x.arg, np.int64(count))
    return x


RELU = LayerKind(
    required=frozenset(), optional=frozenset(),
    infer=lambda name, kind, in_shape, values, where: Layer(name, kind, in_shape, in_shape),
    weights=lambda layer: {}, reference=lambda layer, weights, x: np.maximum(x, x.dtype.type(0)),
    traffic=lambda network, step, batch, e: (2 * e * batch * _size(step.layer.in_shape), 0),
    enqueue=_relu_enqueue, torch=lambda torch, layer, weights, h: torch.nn.functional.relu(h), truth=_relu_truth,
    kernels=("relu_inplace",), owns_output=False, fuse_name="relu")


# -- maxpool2d ------------------------------------------------------------------------------------
def _pool_infer(name, kind, in_shape, values, where) -> Layer:
    c, h, w = _spatial(in_shape, where, kind)
    size, s = values["size"], values.get("stride", values["size"])
    if size > h or size > w:
        raise ConfigError(f"{where}.size: expected at most the input size {h}x{w}, got {size}")
    return Layer(name, kind, in_shape, (c, (h - size) // s + 1, (w - size) // s + 1), size=size, stride=s)


def _pool_enqueue(runner, stream, step, x, out, lane):
    layer, n = step.layer, x.shape[0]
    c, h, w = layer.in_shape
    count = _size(out.shape)
    runner.gpu.launch(stream, runner.layer_kernels["maxpool2d"], (count + THREADS - 1) // THREADS, THREADS, 0,
                      out.arg, x.arg, np.int32(n * c), np.int32(h), np.int32(w), np.int32(layer.size),
                      np.int32(layer.stride))
    return out


def _pool_truth(truth, stream, layer, x, y):
    c, h, w = layer.in_shape
    truth.launch(stream, "maxpool_f64", _size(y.shape), y.arg, x.arg, np.int64(x.shape[0] * c), np.int32(h),
                 np.int32(w), np.int32(layer.size), np.int32(layer.stride))
    return y


MAXPOOL2D = LayerKind(
    required=frozenset({"size"}), optional=frozenset({"stride"}), infer=_pool_infer, weights=lambda layer: {},
    reference=lambda layer, weights, x: maxpool2d_reference(x, cast(int, layer.size), cast(int, layer.stride)),
    traffic=lambda network, step, batch, e: (e * batch * (_size(step.layer.in_shape) + _size(step.layer.out_shape)), 0),
    enqueue=_pool_enqueue,
    torch=lambda torch, layer, weights, h: torch.nn.functional.max_pool2d(h, layer.size, layer.stride),
    truth=_pool_truth, kernels=("maxpool2d",), fuse_name="maxpool")


# -- flatten --------------------------------------------------------------------------------------
FLATTEN = LayerKind(
    required=frozenset(), optional=frozenset(),
    infer=lambda name, kind, in_shape, values, where: Layer(name, kind, in_shape, (_size(in_shape),)),
    weights=lambda layer: {}, reference=lambda layer, weights, x: x.reshape(len(x), _size(x.shape[1:])),
    traffic=lambda network, step, batch, e: (0, 0),
    enqueue=lambda runner, stream, step, x, out, lane: x.reshaped((x.shape[0], _size(x.shape[1:]))),
    torch=lambda torch, layer, weights, h: torch.flatten(h, 1), owns_output=False,
    truth=lambda truth, stream, layer, x, y: x.reshaped((x.shape[0], _size(x.shape[1:]))))


# -- dense ----------------------------------------------------------------------------------------
def _dense_infer(name, kind, in_shape, values, where) -> Layer:
    if len(in_shape) != 1:
        raise ConfigError(f"{where}: dense expected a flat input, got shape {list(in_shape)}; "
                          "add a flatten layer before it")
    return Layer(name, kind, in_shape, (values["out_features"],), out_features=values["out_features"])


def _dense_reference(layer, weights, x):
    kernel = weights[f"{layer.name}.weight"].astype(x.dtype, copy=False)
    return x @ kernel.T + weights[f"{layer.name}.bias"].astype(x.dtype, copy=False)


def _dense_traffic(network, step, batch, e):  # with the relu after it, if any: applied in the epilogue
    n_in, n_out = step.layer.in_shape[0], step.layer.out_features
    return e * (batch * n_in + n_out * n_in + n_out + batch * n_out), 2 * batch * n_in * n_out


def _dense_enqueue(runner, stream, step, x, out, lane):
    """out = x @ w.T + bias (ReLU'd when a relu is fused) with layers.cu's `dense`, a block per
    tile of DENSE_TILE images x DENSE_TILE outputs."""
    n = x.shape[0]
    w, bias = runner.weights[f"{step.layer.name}.weight"], runner.weights[f"{step.layer.name}.bias"]
    out_features, in_features = w.shape
    grid = ((n + DENSE_TILE - 1) // DENSE_TILE, (out_features + DENSE_TILE - 1) // DENSE_TILE)
    runner.gpu.launch(stream, runner.layer_kernels["dense"], grid, DENSE_THREADS, 0, out.arg, x.arg, w.arg, bias.arg,
                      np.int32(n), np.int32(in_features), np.int32(out_features), np.int32(bool(step.fused)))
    return out


def _dense_truth(truth, stream, layer, x, y):
    n, in_features, out_features = x.shape[0], layer.in_shape[0], layer.out_features
    truth.launch(stream, "dense_f64", n * out_features, y.arg, x.arg, truth.weight(f"{layer.name}.weight.T").arg,
                 truth.weight(f"{layer.name}.bias").arg, np.int32(n), np.int32(in_features), np.int32(out_features))
    return y


DENSE = LayerKind(
    required=frozenset({"out_features"}), optional=frozenset(), infer=_dense_infer,
    weights=lambda layer: cast(dict[str, tuple[int, ...]],  # a dense layer has its out_features (_dense_infer)
                               {"weight": (layer.out_features, layer.in_shape[0]), "bias": (layer.out_features,)}),
    reference=_dense_reference, traffic=_dense_traffic, enqueue=_dense_enqueue,
    torch=lambda torch, layer, weights, h: torch.nn.functional.linear(
        h, weights[f"{layer.name}.weight"], weights[f"{layer.name}.bias"]),
    truth=_dense_truth, kernels=("dense",), absorbs_relu=True)


# -- convert and upsample: the input's first step where it crossed the bus in another format ---------
# (convsweep.inputs.formats). y = x / divisor in the network's dtype; upsample also scales each plane up
# bilinearly, as data.upscale_bilinear does on the host (half-pixel centres, edges clamped), and
# clamps the result to [0, 1], the range of a pixel: they make a network's input, not a hidden layer's.
_INPUT_KERNEL = {"uint8": "u8", "float16": "f16", "float32": "f32"}
UPSAMPLE_ROWS = 64  # upsample_u8's rows of blocks: 29 x 64 blocks of 256 at 86x86, each thread ~10 planes of 625


def _convert_infer(name, kind, in_shape, values, where) -> Layer:
    return Layer(name, kind, in_shape, in_shape, divisor=float(values.get("divisor", 1.0)))


def _input_kernel(runner, kind: str, x) -> Any:
    key = f"{kind}_{_INPUT_KERNEL.get(x.dtype.name, x.dtype.name)}"
    if key not in runner.layer_kernels:
        raise ConfigError(f"{kind}: no kernel for {x.dtype.name} input (expected one of {', '.join(_INPUT_KERNEL)})")
    return runner.layer_kernels[key]


def _convert_enqueue(runner, stream, step, x, out, lane):
    count = _size(x.shape)
    per_thread = 4 if x.dtype == np.uint8 else 1  # convert_u8 converts four bytes a thread
    threads = (count + per_thread - 1) // per_thread
    runner.gpu.launch(stream, _input_kernel(runner, "convert", x), (threads + THREADS - 1) // THREADS, THREADS, 0,
                      out.arg, x.arg, np.int64(count), np.float32(step.layer.divisor))
    return out


def _input_traffic(network, step, batch, e):  # the shipped element is network.shipped_dtype's
    shipped = np.dtype(network.shipped_dtype).itemsize
    return batch * (shipped * _size(step.layer.in_shape) + e * _size(step.layer.out_shape)), 0


def _convert_truth(truth, stream, layer, x, y):
    count = _size(x.shape)
    suffix = _INPUT_KERNEL.get(x.dtype.name, "f64" if x.dtype.name == "float64" else x.dtype.name)
    truth.launch(stream, f"convert_{suffix}_f64", count, y.arg, x.arg, np.int64(count), np.float64(layer.divisor))
    return y


CONVERT = LayerKind(
    required=frozenset(), optional=frozenset({"divisor"}), infer=_convert_infer, weights=lambda layer: {},
    reference=lambda layer, weights, x: x / x.dtype.type(layer.divisor),
    traffic=_input_traffic, enqueue=_convert_enqueue,
    torch=lambda torch, layer, weights, h: h.float() / layer.divisor, truth=_convert_truth,
    kernels=("convert_u8", "convert_f16", "convert_f32"), absorbed_args=lambda layer: (np.float32(layer.divisor),))


def _upsample_infer(name, kind, in_shape, values, where) -> Layer:
    c, _, _ = _spatial(in_shape, where, kind)
    size = values["size"]
    return Layer(name, kind, in_shape, (c, size, size), size=size, divisor=float(values.get("divisor", 1.0)))


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """float64 [n_out, n_in]: output i as a blend of its two nearest inputs (half-pixel centres,
    sources before the first centre clamped to it, as torch's align_corners=False)."""
    src = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    matrix = np.zeros((n_out, n_in), dtype=np.float64)
    np.add.at(matrix, (np.arange(n_out), lo), 1.0 - frac)
    np.add.at(matrix, (np.arange(n_out), hi), frac)
    return matrix


def _upsample_reference(layer, weights, x):
    _, h, w = layer.in_shape
    rows = bilinear_matrix(h, layer.size).astype(x.dtype)
    cols = bilinear_matrix(w, layer.size).astype(x.dtype)
    out = rows @ (x / x.dtype.type(layer.divisor)) @ cols.T
    return np.clip(out, 0.0, 1.0, out=out)


def _upsample_args(layer: Layer) -> tuple:
    """upsample_u8's last arguments, which a conv kernel absorbing the layer takes too: the
    source-to-output ratios in double, as numpy's n_in / n_out, and the divisor."""
    _, h, w = layer.in_shape
    assert layer.size is not None  # an upsample layer's (_upsample_infer)
    return np.float64(h / layer.size), np.float64(w / layer.size), np.float32(layer.divisor)


def _upsample_enqueue(runner, stream, step, x, out, lane):
    """Blocks over the output positions, UPSAMPLE_ROWS rows of them striding over the planes."""
    n, (c, h, w), size = x.shape[0], step.layer.in_shape, step.layer.size
    grid = ((size * size + THREADS - 1) // THREADS, min(n * c, UPSAMPLE_ROWS))
    runner.gpu.launch(stream, _input_kernel(runner, "upsample", x), grid, THREADS, 0,
                      out.arg, x.arg, np.int32(n * c), np.int32(h), np.int32(w), np.int32(size), np.int32(size),
                      *_upsample_args(step.layer))
    return out


def _upsample_truth(truth, stream, layer, x, y):
    (c, h, w), size = layer.in_shape, layer.size
    truth.launch(stream, "upsample_u8_f64", _size(y.shape), y.arg, x.arg, np.int64(x.shape[0] * c), np.int32(h),
                 np.int32(w), np.int32(size), np.int32(size), np.float64(layer.divisor))
    return y


UPSAMPLE = LayerKind(
    required=frozenset({"size"}), optional=frozenset({"divisor"}), infer=_upsample_infer, weights=lambda layer: {},
    reference=_upsample_reference, traffic=_input_traffic, enqueue=_upsample_enqueue,
    torch=lambda torch, layer, weights, h: torch.nn.functional.interpolate(
        h.float() / layer.divisor, size=(layer.size, layer.size), mode="bilinear", align_corners=False).clamp(0, 1),
    truth=_upsample_truth, kernels=("upsample_u8",), absorbed_args=_upsample_args)


LAYER_KINDS: dict[str, LayerKind] = {"conv2d": CONV2D, "relu": RELU, "maxpool2d": MAXPOOL2D, "flatten": FLATTEN,
                                     "dense": DENSE, "convert": CONVERT, "upsample": UPSAMPLE}
