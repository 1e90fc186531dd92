"""Networks as YAML data, their weights, and the numpy reference every GPU result is checked against."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from convsweep.errors import ConfigError, DataError, ShapeError
from convsweep.yamlio import load_yaml

DTYPES = ("float16", "float32", "float64")

# Keys each layer type accepts: (required, optional with defaults applied in _build_layer).
LAYER_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "conv2d": (frozenset({"out_channels", "kernel"}), frozenset({"stride"})),
    "relu": (frozenset(), frozenset()),
    "maxpool2d": (frozenset({"size"}), frozenset({"stride"})),
    "flatten": (frozenset(), frozenset()),
    "dense": (frozenset({"out_features"}), frozenset()),
}
NETWORK_KEYS = (frozenset({"name", "input", "layers"}), frozenset({"dtype", "weights"}))

CONV_CHUNK_ELEMENTS = 1 << 22  # bounds the im2col buffer (32 MiB in float64) however large the batch
FORWARD_CHUNK = 64  # images per pass through the whole network in reference_forward
RANDOM = "random"  # `weights: random`: seeded weights for workloads measured for speed, not accuracy


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

    def conv_dims(self, batch: int) -> dict[str, int]:
        """The (B, C, M, H, W, K, S) problem of a conv layer, in the names kernels and reports use."""
        if self.type != "conv2d":
            raise ValueError(f"layer {self.name}: conv_dims needs a conv2d layer, got {self.type}")
        c, h, w = self.in_shape
        m, h_out, w_out = self.out_shape
        return {"B": batch, "C": c, "M": m, "H": h, "W": w, "K": self.kernel, "S": self.stride,
                "H_out": h_out, "W_out": w_out}


@dataclass(frozen=True)
class Network:
    """A network description: layers with shapes, storage dtype and where its weights are."""

    name: str
    path: Path
    input_shape: tuple[int, ...]
    dtype: str
    layers: tuple[Layer, ...]
    weights_path: Path | None
    random_weights: bool = False  # `weights: random`: no trained weights, so no meaningful accuracy

    @property
    def conv_layers(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.type == "conv2d")

    def fused_layers(self, conv_name: str, fuses: tuple[str, ...]) -> tuple[Layer, ...]:
        """The layers right after `conv_name` that a kernel fusing `fuses` (relu, maxpool) computes.

        A fused kernel writes what the last of them would, so they must follow the conv in that
        order; otherwise the variant cannot stand in for this layer.
        """
        index = [layer.name for layer in self.layers].index(conv_name)
        after = self.layers[index + 1 : index + 1 + len(fuses)]
        kinds = tuple({"relu": "relu", "maxpool2d": "maxpool"}.get(layer.type, layer.type) for layer in after)
        if kinds != tuple(fuses):
            raise ShapeError(f"{self.path}: layer {conv_name} is followed by {', '.join(kinds) or 'nothing'}, "
                             f"but the variant fuses {', '.join(fuses)} after it")
        return tuple(after)

    def relu_after(self, name: str) -> tuple[Layer, ...]:
        """The relu right after layer `name` (or nothing): the dense kernel applies it in its epilogue."""
        index = [layer.name for layer in self.layers].index(name)
        after = self.layers[index + 1 : index + 2]
        return tuple(after) if after and after[0].type == "relu" else ()

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        known = ", ".join(layer.name for layer in self.layers)
        raise ConfigError(f"{self.path}: no layer named {name!r}; expected one of {known}")


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _check_keys(mapping: dict, required: frozenset[str], optional: frozenset[str], prefix: str) -> None:
    unknown = sorted(set(mapping) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key; expected one of {allowed}")
    missing = sorted(required - set(mapping))
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: missing required key")


def _spatial(in_shape: tuple[int, ...], where: str, kind: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ConfigError(f"{where}: {kind} expected a [C, H, W] input, got shape {list(in_shape)}")
    c, h, w = in_shape
    return c, h, w


def _build_layer(spec: Any, index: int, in_shape: tuple[int, ...], where_file: str) -> Layer:
    where = f"{where_file}: layers[{index}]"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping with name and type, got {spec!r}")
    for key in ("name", "type"):
        if key not in spec:
            raise ConfigError(f"{where}.{key}: missing required key")
    name, kind = spec["name"], spec["type"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
    if kind not in LAYER_KEYS:
        raise ConfigError(f"{where}.type: expected one of {', '.join(LAYER_KEYS)}, got {kind!r}")
    required, optional = LAYER_KEYS[kind]
    fields = {k: v for k, v in spec.items() if k not in ("name", "type")}
    _check_keys(fields, required, optional, f"{where}.")
    values = {key: _positive_int(value, f"{where}.{key}") for key, value in fields.items()}

    if kind == "conv2d":
        c, h, w = _spatial(in_shape, where, kind)
        k, s = values["kernel"], values.get("stride", 1)
        if k > h or k > w:
            raise ConfigError(f"{where}.kernel: expected at most the input size {h}x{w}, got {k}")
        out = (values["out_channels"], (h - k) // s + 1, (w - k) // s + 1)
        return Layer(name, kind, in_shape, out, out_channels=values["out_channels"], kernel=k, stride=s)
    if kind == "maxpool2d":
        c, h, w = _spatial(in_shape, where, kind)
        size, s = values["size"], values.get("stride", values["size"])
        if size > h or size > w:
            raise ConfigError(f"{where}.size: expected at most the input size {h}x{w}, got {size}")
        out = (c, (h - size) // s + 1, (w - size) // s + 1)
        return Layer(name, kind, in_shape, out, size=size, stride=s)
    if kind == "dense":
        if len(in_shape) != 1:
            raise ConfigError(
                f"{where}: dense expected a flat input, got shape {list(in_shape)}; add a flatten layer before it"
            )
        return Layer(name, kind, in_shape, (values["out_features"],), out_features=values["out_features"])
    if kind == "flatten":
        return Layer(name, kind, in_shape, (int(np.prod(in_shape)),))
    return Layer(name, kind, in_shape, in_shape)


def load_network(path: str | os.PathLike) -> Network:
    """Read and validate a network YAML, inferring every layer's shapes."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        spec = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {line}not valid YAML: {problem}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a mapping with name, input and layers, got {type(spec).__name__}")
    _check_keys(spec, *NETWORK_KEYS, prefix=f"{path}: ")

    name = spec["name"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: name: expected a non-empty string, got {name!r}")
    raw_input = spec["input"]
    if not isinstance(raw_input, list) or len(raw_input) not in (1, 3):
        raise ConfigError(f"{path}: input: expected [C, H, W] or [features], got {raw_input!r}")
    input_shape = tuple(_positive_int(v, f"{path}: input[{i}]") for i, v in enumerate(raw_input))
    dtype = spec.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ConfigError(f"{path}: dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    weights = spec.get("weights")
    if weights is not None and (not isinstance(weights, str) or not weights):
        raise ConfigError(f"{path}: weights: expected a path relative to this file, or 'random', got {weights!r}")
    weights_path = (path.resolve().parent / weights).resolve() if weights and weights != RANDOM else None

    layer_specs = spec["layers"]
    if not isinstance(layer_specs, list) or not layer_specs:
        raise ConfigError(f"{path}: layers: expected a non-empty list, got {layer_specs!r}")
    layers: list[Layer] = []
    shape = input_shape
    for index, layer_spec in enumerate(layer_specs):
        layer = _build_layer(layer_spec, index, shape, str(path))
        if any(prev.name == layer.name for prev in layers):
            raise ConfigError(f"{path}: layers[{index}].name: expected a unique name, got duplicate {layer.name!r}")
        layers.append(layer)
        shape = layer.out_shape
    return Network(name, path, input_shape, dtype, tuple(layers), weights_path, random_weights=weights == RANDOM)


def weight_shapes(network: Network) -> dict[str, tuple[int, ...]]:
    """The arrays a weights file must hold for this network, by key."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in network.layers:
        if layer.type == "conv2d":
            m, c = layer.out_channels, layer.in_shape[0]
            shapes[f"{layer.name}.weight"] = (m, c, layer.kernel, layer.kernel)
            shapes[f"{layer.name}.bias"] = (m,)
        elif layer.type == "dense":
            shapes[f"{layer.name}.weight"] = (layer.out_features, layer.in_shape[0])
            shapes[f"{layer.name}.bias"] = (layer.out_features,)
    return shapes


def load_weights(network: Network) -> dict[str, np.ndarray]:
    """Read the network's npz, checking every array's presence, shape and finiteness."""
    if network.random_weights:
        return random_weights(network)
    path = network.weights_path
    if path is None:
        raise DataError(f"{network.path}: weights: missing; expected a path to an .npz file, or 'random'")
    if not path.is_file():
        raise DataError(f"{path}: no such file (weights of {network.path})")
    expected = weight_shapes(network)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from None
    extra = sorted(set(arrays) - set(expected))
    if extra:
        raise DataError(f"{path}: {extra[0]}: unexpected array; {network.name} expects {', '.join(expected)}")
    weights: dict[str, np.ndarray] = {}
    for key, shape in expected.items():
        if key not in arrays:
            raise DataError(f"{path}: {key}: missing; expected shape {shape}")
        array = arrays[key]
        if array.shape != shape:
            raise DataError(f"{path}: {key}: expected shape {shape}, got {array.shape}")
        if not np.issubdtype(array.dtype, np.floating):
            raise DataError(f"{path}: {key}: expected floating-point values, got {array.dtype}")
        if not np.all(np.isfinite(array)):
            raise DataError(f"{path}: {key}: expected finite values, found NaN or inf")
        weights[key] = array.astype(network.dtype)
    return weights


def random_weights(network: Network) -> dict[str, np.ndarray]:
    """Weights seeded by the network's name, scaled by 1/sqrt(fan-in) so activations stay O(1)."""
    rng = np.random.default_rng(list(network.name.encode()))
    shapes = weight_shapes(network)
    weights = {}
    for key, shape in shapes.items():
        fan_in = int(np.prod(shapes[key.rsplit(".", 1)[0] + ".weight"][1:]))
        weights[key] = (rng.uniform(-1.0, 1.0, shape) / np.sqrt(fan_in)).astype(network.dtype)
    return weights


def conv2d_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1) -> np.ndarray:
    """Valid convolution y[b,m,h,w] = bias[m] + sum x[b,c,h*S+p,w*S+q] k[m,c,p,q], in x's dtype.

    im2col + one GEMM per image, in chunks so the column buffer stays bounded for any batch.
    """
    if x.ndim != 4 or w.ndim != 4 or b.ndim != 1:
        raise ShapeError(
            f"conv2d_reference: expected x [B,C,H,W], w [M,C,K,K], b [M]; got {x.shape}, {w.shape}, {b.shape}"
        )
    batch, c, h, width = x.shape
    m, wc, k, k2 = w.shape
    if wc != c or k != k2 or b.shape[0] != m:
        raise ShapeError(f"conv2d_reference: x {x.shape} does not fit w {w.shape} and b {b.shape}")
    if k > h or k > width:
        raise ShapeError(f"conv2d_reference: kernel {k} larger than the input {h}x{width}")
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)
    s = stride
    h_out, w_out = (h - k) // s + 1, (width - k) // s + 1
    kernel_matrix = w.reshape(m, c * k * k).astype(dtype)
    bias = b.astype(dtype)[:, None]
    out = np.empty((batch, m, h_out, w_out), dtype=dtype)
    per_image = c * k * k * h_out * w_out
    if per_image > CONV_CHUNK_ELEMENTS:  # one image's columns alone are too large: shift and multiply
        return _conv2d_by_offsets(x.astype(dtype, copy=False), w.astype(dtype), bias, s, h_out, w_out)
    chunk = max(1, min(256, CONV_CHUNK_ELEMENTS // per_image))
    for start in range(0, batch, chunk):
        xs = x[start : start + chunk].astype(dtype, copy=False)
        windows = np.lib.stride_tricks.sliding_window_view(xs, (k, k), axis=(2, 3))[:, :, ::s, ::s]
        # [n, C, K, K, H_out, W_out] keeps the long W_out run innermost, so the copy streams.
        columns = np.ascontiguousarray(windows.transpose(0, 1, 4, 5, 2, 3))
        columns = columns.reshape(len(xs), c * k * k, h_out * w_out)
        result = np.matmul(kernel_matrix, columns)
        result += bias
        out[start : start + chunk] = result.reshape(len(xs), m, h_out, w_out)
    return out


def _conv2d_by_offsets(x, w, bias, s, h_out, w_out):
    """y = bias + sum over (p, q) of k[:, :, p, q] @ x shifted by (p, q): K*K GEMMs, no column buffer.

    For large layers (256 channels on 228x228): memory stays one shifted input per image.
    """
    m, c, k, _ = w.shape
    out = np.empty((len(x), m, h_out * w_out), dtype=x.dtype)
    for i, image in enumerate(x):
        acc = np.repeat(bias, h_out * w_out, axis=1)
        for p in range(k):
            for q in range(k):
                shifted = np.ascontiguousarray(image[:, p : p + s * h_out : s, q : q + s * w_out : s]).reshape(c, -1)
                acc += w[:, :, p, q] @ shifted
        out[i] = acc
    return out.reshape(len(x), m, h_out, w_out)


def maxpool2d_reference(x: np.ndarray, size: int, stride: int) -> np.ndarray:
    """Max over size x size windows at `stride`, dropping a partial last window (floor)."""
    h_out = (x.shape[2] - size) // stride + 1
    w_out = (x.shape[3] - size) // stride + 1
    # One elementwise maximum per window offset: numpy reduces strided slices far faster than windows.
    out = x[:, :, : stride * h_out : stride, : stride * w_out : stride].copy()
    for p in range(size):
        for q in range(size):
            np.maximum(out, x[:, :, p : p + stride * h_out : stride, q : q + stride * w_out : stride], out=out)
    return out


def reference_layer(layer: Layer, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """One layer in numpy, in x's dtype, so a GPU runner can compare layer by layer."""
    if x.shape[1:] != layer.in_shape:
        expected = ", ".join(map(str, layer.in_shape))
        raise ShapeError(f"layer {layer.name}: expected input [B, {expected}], got {list(x.shape)}")
    if layer.type == "conv2d":
        return conv2d_reference(x, weights[f"{layer.name}.weight"], weights[f"{layer.name}.bias"], layer.stride)
    if layer.type == "relu":
        return np.maximum(x, x.dtype.type(0))
    if layer.type == "maxpool2d":
        return maxpool2d_reference(x, layer.size, layer.stride)
    if layer.type == "flatten":
        return x.reshape(len(x), int(np.prod(x.shape[1:])))
    if layer.type == "dense":
        kernel = weights[f"{layer.name}.weight"].astype(x.dtype, copy=False)
        return x @ kernel.T + weights[f"{layer.name}.bias"].astype(x.dtype, copy=False)
    raise ConfigError(f"layer {layer.name}: no reference for type {layer.type!r}")


def reference_forward(
    network: Network, weights: dict[str, np.ndarray], x: np.ndarray, dtype: type | np.dtype = np.float64
) -> np.ndarray:
    """Logits [B, classes] of the whole network, every layer in numpy at `dtype`.

    Runs FORWARD_CHUNK images at a time through all layers, so intermediates stay small and
    hot in memory instead of a gigabyte per layer for a large batch.
    """
    x = np.asarray(x)
    if x.shape[1:] != network.input_shape:
        raise ShapeError(
            f"{network.path}: expected input [B, {', '.join(map(str, network.input_shape))}], got {list(x.shape)}"
        )
    cast = {key: array.astype(dtype) for key, array in weights.items()}
    chunks = []
    for start in range(0, max(len(x), 1), FORWARD_CHUNK):
        out = x[start : start + FORWARD_CHUNK].astype(dtype)
        for layer in network.layers:
            out = reference_layer(layer, cast, out)
        chunks.append(out)
    return np.concatenate(chunks)
