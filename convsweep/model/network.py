"""Networks as YAML data, their weights, and the numpy reference every GPU result is checked against."""

from __future__ import annotations

import functools
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from convsweep.base.errors import ConfigError, DataError, ShapeError
from .layers import LAYER_KINDS, Layer
from convsweep.base.progress import progress
from .variants import DTYPES as ELEMENT_BYTES, ConvShape
from convsweep.base.yamlio import read_yaml_file

DTYPES = tuple(ELEMENT_BYTES)  # what a network may store: the element types kernels are built for

NETWORK_KEYS = (frozenset({"name", "input", "layers"}), frozenset({"dtype", "weights"}))

FORWARD_CHUNK = 64  # images per pass through the whole network in reference_forward
PARALLEL_MIN_IMAGES = 256  # reference_forward_parallel splits this many images or more over threads
RANDOM = "random"  # `weights: random`: seeded weights for workloads measured for speed, not accuracy
MAX_SIZE = 65_536  # of any size a network file gives (channels, sides, kernels, features): the largest here is 256
MAX_LAYERS = 256


@dataclass(frozen=True)
class Step:
    """One launch of a network pass: `layer`, and the layers after it that its kernel also computes;
    `absorbed`: the network's first layer where a conv's kernel computes it too (its x is then the
    shipped batch, and that layer has no step of its own)."""

    layer: Layer
    fused: tuple[Layer, ...] = ()
    absorbed: Layer | None = None

    @property
    def last(self) -> Layer:
        """The layer whose output this step writes."""
        return self.fused[-1] if self.fused else self.layer


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
    input_dtype: str | None = None  # what the input arrives as where not `dtype` (convsweep.inputs.formats)

    @property
    def shipped_dtype(self) -> str:
        """The input's element type on the host and the bus."""
        return self.input_dtype or self.dtype

    @property
    def conv_layers(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.is_conv)

    def fused_layers(self, conv_name: str, fuses: tuple[str, ...]) -> tuple[Layer, ...]:
        """The layers right after `conv_name` that a kernel fusing `fuses` (relu, maxpool) computes.

        A fused kernel writes what the last of them would, so they must follow the conv in that
        order; otherwise the variant cannot stand in for this layer.
        """
        index = [layer.name for layer in self.layers].index(conv_name)
        after = self.layers[index + 1 : index + 1 + len(fuses)]
        kinds = tuple(layer.kind.fuse_name or layer.type for layer in after)
        if kinds != tuple(fuses):
            raise ShapeError(f"{self.path}: layer {conv_name} is followed by {', '.join(kinds) or 'nothing'}, "
                             f"but the variant fuses {', '.join(fuses)} after it")
        return tuple(after)

    def absorbed_input(self, conv_name: str, absorbs: tuple[str, ...]) -> Layer | None:
        """The network's first layer where conv `conv_name` comes right after it and a kernel absorbing
        `absorbs` (registry absorbs_input) computes it too; else None, and that layer runs on its own."""
        if len(self.layers) < 2 or not self.layers[1].is_conv or self.layers[1].name != conv_name:
            return None
        first = self.layers[0]
        return first if first.kind.absorbable and first.type in absorbs else None

    def conv_shape(self, layer: Layer, batch: int, fused: tuple[Layer, ...] = (),
                   absorbed: Layer | None = None) -> ConvShape:
        """The kernel's problem for a conv layer and the layers fused into it: its own relu and
        max-pool (which sets P, PS), then any later layers a fused network computes (the tail); where
        it absorbs the network's first layer, that layer's input is what it reads (SRC_H, SRC_W, SRC_E)."""
        c, h, w = layer.in_shape
        own = 0
        while own < len(fused) and fused[own].kind.fuse_name in ("relu", "maxpool"):
            own += 1
            if fused[own - 1].kind.fuse_name == "maxpool":
                break
        pool = next((f for f in fused[:own] if f.kind.fuse_name == "maxpool"), None)
        source = (0, 0, 0)
        if absorbed is not None:
            _, src_h, src_w = absorbed.in_shape
            source = (src_h, src_w, np.dtype(self.shipped_dtype).itemsize)
        assert layer.out_channels is not None and layer.kernel is not None and layer.stride is not None  # a conv's
        return ConvShape(B=batch, C=c, M=layer.out_channels, H=h, W=w, K=layer.kernel, S=layer.stride,
                         P=cast(int, pool.size) if pool else 0, PS=cast(int, pool.stride) if pool else 0,
                         dtype=self.dtype, tail=tuple(fused[own:]), SRC_H=source[0], SRC_W=source[1], SRC_E=source[2])

    def variant_shape(self, layer: Layer, fuses: tuple[str, ...], batch: int = 1,
                      absorbs: tuple[str, ...] = ()) -> ConvShape:
        """The problem a variant fusing `fuses` and absorbing `absorbs` solves at conv `layer` (one
        image by default: the shape a build fixes); ShapeError when the layers after it are not what it fuses."""
        fused = self.fused_layers(layer.name, fuses)
        return self.conv_shape(layer, batch, fused, self.absorbed_input(layer.name, absorbs))

    def step_shape(self, step: Step, batch: int) -> ConvShape:
        """The problem of a conv step's kernel for `batch` images."""
        return self.conv_shape(step.layer, batch, step.fused, step.absorbed)

    def steps(self, fuses: dict[str, tuple[str, ...]], absorbs: dict[str, tuple[str, ...]] | None = None) -> list[Step]:
        """The launched steps in order when conv layer `name` runs a variant fusing `fuses[name]`
        (relu, maxpool, or on to the network's end) and absorbing `absorbs[name]` (registry
        absorbs_input): such a step swallows those layers (and the network's first layer, where it
        absorbs it), and a dense step the relu right after it. A conv layer a step swallowed needs no
        entry in `fuses`."""
        found = (self.absorbed_input(name, tuple(kinds)) for name, kinds in (absorbs or {}).items())
        absorbed = next((layer for layer in found if layer is not None), None)
        steps: list[Step]
        steps, skip = [], 1 if absorbed else 0
        for layer in self.layers:
            if skip:
                skip -= 1
                continue
            if layer.is_conv:
                fused = self.fused_layers(layer.name, tuple(fuses.get(layer.name, ())))
            else:
                fused = self.relu_after(layer.name) if layer.kind.absorbs_relu else ()
            steps.append(Step(layer, fused, absorbed if absorbed and not steps else None))
            skip = len(fused)
        return steps

    def swallowed(self, fuses: dict[str, tuple[str, ...]]) -> dict[str, str]:
        """{conv layer: the earlier conv layer whose step computes it} when the conv layers named in
        `fuses` run variants fusing those layers (a fused network swallows the later convs)."""
        swallowed = {}
        for step in self.steps(fuses):
            swallowed.update({layer.name: step.layer.name for layer in step.fused if layer.is_conv})
        return swallowed

    def relu_after(self, name: str) -> tuple[Layer, ...]:
        """The relu right after layer `name` (or nothing): the dense kernel applies it in its epilogue."""
        index = [layer.name for layer in self.layers].index(name)
        after = self.layers[index + 1 : index + 2]
        return tuple(after) if after and after[0].kind.fuse_name == "relu" else ()

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        known = ", ".join(layer.name for layer in self.layers)
        raise ConfigError(f"{self.path}: no layer named {name!r}; expected one of {known}")


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIZE:
        raise ConfigError(f"{where}: expected a positive integer of at most {MAX_SIZE:,}, got {value!r:.60}")
    return value


def _check_keys(mapping: dict, required: frozenset[str], optional: frozenset[str], prefix: str) -> None:
    unknown = sorted(set(mapping) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key; expected one of {allowed}")
    missing = sorted(required - set(mapping))
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: missing required key")


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
    if kind not in LAYER_KINDS:
        raise ConfigError(f"{where}.type: expected one of {', '.join(LAYER_KINDS)}, got {kind!r}")
    layer_kind = LAYER_KINDS[kind]
    fields = {k: v for k, v in spec.items() if k not in ("name", "type")}
    _check_keys(fields, layer_kind.required, layer_kind.optional, f"{where}.")
    values = {key: _positive_int(value, f"{where}.{key}") for key, value in fields.items()}
    return layer_kind.infer(name, kind, in_shape, values, where)


def load_network(path: str | os.PathLike) -> Network:
    """Read and validate a network YAML, inferring every layer's shapes."""
    path = Path(path)
    spec = read_yaml_file(path)
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
    if not isinstance(layer_specs, list) or not 0 < len(layer_specs) <= MAX_LAYERS:
        raise ConfigError(f"{path}: layers: expected a list of 1 to {MAX_LAYERS} layers, got {layer_specs!r:.60}")
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
    return {f"{layer.name}.{part}": shape for layer in network.layers for part, shape in layer.kind.weights(layer).items()}


def _weights_file(network: Network) -> Path:
    path = network.weights_path
    if path is None:
        raise DataError(f"{network.path}: weights: missing; expected a path to an .npz file, or 'random'")
    if not path.is_file():
        raise DataError(f"{path}: no such file (weights of {network.path})")
    return path


def _check_arrays(network: Network, path: Path, found: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """The arrays of a weights file (key -> shape, dtype) must be exactly the network's, in shape and
    floating-point; DataError names the file and the first array that is not."""
    expected = weight_shapes(network)
    extra = sorted(set(found) - set(expected))
    if extra:
        raise DataError(f"{path}: {extra[0]}: unexpected array; {network.name} expects {', '.join(expected)}")
    for key, shape in expected.items():
        if key not in found:
            raise DataError(f"{path}: {key}: missing; expected shape {shape}")
        if found[key][0] != shape:
            raise DataError(f"{path}: {key}: expected shape {shape}, got {found[key][0]}")
        if not np.issubdtype(found[key][1], np.floating):
            raise DataError(f"{path}: {key}: expected floating-point values, got {found[key][1]}")


def check_weights(network: Network) -> None:
    """What the planner can tell of the network's weights without reading them: the file is there
    and holds exactly the arrays of the network's layers, in their shapes (from the .npy headers)."""
    if network.random_weights:
        return
    path = _weights_file(network)
    stat = path.stat()
    _check_arrays(network, path, _npz_headers(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _npz_headers(path: Path, mtime_ns: int, size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each array of an .npz from its .npy header alone, remembered per file version:
    the Snakefile plans every sweep, and a job file's weights should not be read at each plan."""
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(member)
                headers[info.filename.removesuffix(".npy")] = (shape, dtype)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from None
    return headers


def load_weights(network: Network) -> dict[str, np.ndarray]:
    """Read the network's npz, checking every array's presence, shape and finiteness."""
    if network.random_weights:
        return random_weights(network)
    path = _weights_file(network)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from None
    _check_arrays(network, path, {key: (array.shape, array.dtype) for key, array in arrays.items()})
    weights: dict[str, np.ndarray] = {}
    for key in weight_shapes(network):
        if not np.all(np.isfinite(arrays[key])):
            raise DataError(f"{path}: {key}: expected finite values, found NaN or inf")
        weights[key] = arrays[key].astype(network.dtype)
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


def reference_layer(layer: Layer, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """One layer in numpy, in x's dtype, so a GPU runner can compare layer by layer."""
    if x.shape[1:] != layer.in_shape:
        expected = ", ".join(map(str, layer.in_shape))
        raise ShapeError(f"layer {layer.name}: expected input [B, {expected}], got {list(x.shape)}")
    return layer.kind.reference(layer, weights, x)


def reference_forward(
    network: Network, weights: dict[str, np.ndarray], x: np.ndarray, dtype: type | np.dtype = np.float64,
    quiet: bool = False,
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
    with progress(total=len(x), desc=f"{np.dtype(dtype).name} reference forward", unit="image",
                  enabled=len(x) > FORWARD_CHUNK and not quiet) as shown:
        for start in range(0, max(len(x), 1), FORWARD_CHUNK):
            out = x[start : start + FORWARD_CHUNK].astype(dtype)
            for layer in network.layers:
                out = reference_layer(layer, cast, out)
            chunks.append(out)
            shown.update(len(out))
    return np.concatenate(chunks)


def reference_forward_parallel(network: Network, weights: dict[str, np.ndarray], x: np.ndarray,
                               workers: int | None = None, least: int = PARALLEL_MIN_IMAGES) -> np.ndarray:
    """reference_forward's float64 logits, bit for bit, with the images split over `workers`
    threads (the CPUs this process may use): the reference of a fresh round of 10,000 images takes
    about 16 s on one core. numpy's copies and GEMMs let go of the GIL; BLAS is held to one thread
    inside, so N threads do not each start N of their own. Parts are whole FORWARD_CHUNKs: every
    image goes through the same numpy calls as in one thread."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    x = np.asarray(x)
    workers = min(workers or _usable_cpus(), -(-len(x) // FORWARD_CHUNK))
    if workers < 2 or len(x) < least:
        return reference_forward(network, weights, x, dtype=np.float64)
    per = -(-len(x) // workers)
    per = -(-per // FORWARD_CHUNK) * FORWARD_CHUNK
    starts = range(0, len(x), per)
    weights = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(len(starts)) as pool, \
            progress(total=len(x), desc="float64 reference forward", unit="image") as shown:
        def part(start: int) -> np.ndarray:
            logits = reference_forward(network, weights, x[start : start + per], dtype=np.float64, quiet=True)
            shown.update(len(logits))
            return logits

        return np.concatenate(list(pool.map(part, starts)))


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, as Linux does; else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
