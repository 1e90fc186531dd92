"""The float64 truth on the GPU: the network in double on exactly what a pass shipped, and a candidate's
output compared with it, image by image, on the device (kernels/truth.cu).

It runs after the candidate's pass and outside its timing, so every timed pass can be checked against
float64 however large the batch, where a reference on the host had to be rationed. Its kernels are
deliberately simple (one thread per output, a fixed order of summation): the CPU tests hold them to
numpy's float64 reference (convsweep.model.reference), and a job holds its first round to numpy too
(`check_against_host`). `Truth` owns the module on one Gpu, the weights in float64 and the buffers of
a forward pass, which runs in chunks of images so that any batch fits in bounded memory; each layer
kind says how its float64 kernel is launched (convsweep.model.layers, LayerKind.truth).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from convsweep.model.checks import RowStats
from .compile import compile_source
from convsweep.base.errors import ConvsweepError
from .gpu import DeviceArray
from convsweep.base.paths import KERNELS_DIR

if TYPE_CHECKING:
    from convsweep.model.network import Network

TRUTH_SOURCE = KERNELS_DIR / "truth.cu"
THREADS = 256
MAX_BLOCKS = 1 << 16  # the kernels stride over their outputs: a bounded grid covers any count
CHUNK_BYTES = 256 << 20  # the largest float64 activation of one chunk of images
PART_ELEMENTS = 4096  # compare_parts: outputs per part of an image (a classifier's logits are one part)
MAX_PARTS = 256
HOST_CHECK_FLOPS = 2e10  # the host's float64 reference of round 0's first and last images, within this
HOST_CHECK_TOLERANCE = 1e-12  # normwise: the two float64 references differ in their order of summation alone
DTYPE_SUFFIX = {"uint8": "u8", "float16": "f16", "float32": "f32", "float64": "f64"}


class TruthKernels:
    """kernels/truth.cu loaded on `gpu` for `arch`, its kernels by name, and how they are launched."""

    def __init__(self, gpu, arch: str):
        self.gpu = gpu
        self.build = compile_source(TRUTH_SOURCE, "truth", {}, arch)
        self.module = gpu.module(self.build)
        self._kernels: dict[str, object] = {}

    def launch(self, stream, name: str, count: int, *args) -> None:
        """Kernel `name` over `count` outputs (it strides over what its grid does not cover)."""
        if name not in self._kernels:
            self._kernels[name] = self.gpu.kernel(self.module, name)
        blocks = max(1, min(MAX_BLOCKS, -(-int(count) // THREADS)))
        self.gpu.launch(stream, self._kernels[name], blocks, THREADS, 0, *args)


def f64_view(buffer: DeviceArray, shape: tuple[int, ...]) -> DeviceArray:
    """The first prod(shape) doubles of a flat float64 buffer, as an array of `shape`."""
    assert math.prod(shape) <= math.prod(buffer.shape), f"{shape} does not fit {buffer.shape}"
    return DeviceArray(buffer.ptr, tuple(shape), np.dtype(np.float64))


class Truth:
    """The network in float64 on the GPU (module docstring). `forward` writes the logits (the last
    layer's output) of n shipped images; `compare` holds an output to them."""

    def __init__(self, kernels: TruthKernels, network: Network, weights: dict[str, np.ndarray], stream):
        self.kernels, self.gpu, self.network = kernels, kernels.gpu, network
        self.weights = {name: self.gpu.to_device(np.ascontiguousarray(array, np.float64), stream)
                        for name, array in weights.items()}
        # a dense layer's weights also transposed, `<name>.T` ([in][out]): dense_f64's warps then read them whole
        self.weights |= {f"{name}.T": self.gpu.to_device(np.ascontiguousarray(np.asarray(array, np.float64).T), stream)
                         for name, array in weights.items() if np.ndim(array) == 2}
        per_image = max([math.prod(network.input_shape)] + [math.prod(layer.out_shape) for layer in network.layers])
        self.chunk = max(1, CHUNK_BYTES // (8 * per_image))
        self._capacity = 0
        self._per_image = per_image
        self._buffers: list[DeviceArray] = []
        self._compare: dict[str, DeviceArray] = {}

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.network.layers[-1].out_shape)

    def _room(self, n: int) -> list[DeviceArray]:
        """Two float64 buffers for min(n, chunk) images of the widest activation: the layers go back and forth."""
        need = min(n, self.chunk)
        if need > self._capacity:  # lasting: a job's first forward may come inside a setting's scope
            self._buffers = [self.gpu.alloc((need * self._per_image,), np.float64, lasting=True) for _ in range(2)]
            self._capacity = need
        return self._buffers

    def forward(self, x: DeviceArray, n: int, out: DeviceArray, stream,
                keep: dict[str, DeviceArray] | None = None) -> None:
        """The float64 output of images x[:n] (as shipped) into out[:n]; `keep`: layer name -> a float64
        array of n rows that also gets that layer's output (the conv samples' truth)."""
        if n == 0:
            return
        layers = self.network.layers
        for lo in range(0, n, self.chunk):
            hi = min(n, lo + self.chunk)
            m = hi - lo
            a, b = self._room(n)
            cur = x.rows(lo, hi)
            if not layers[0].kind.makes_input:  # the network's own input: in double, as the host casts it
                count = m * math.prod(self.network.input_shape)
                self.kernels.launch(stream, f"convert_{DTYPE_SUFFIX[cur.dtype.name]}_f64", count, a.arg, cur.arg,
                                    np.int64(count), np.float64(1.0))
                cur = f64_view(a, (m, *self.network.input_shape))
            for layer in layers:
                free = b if cur.ptr == a.ptr else a
                target = out.rows(lo, hi) if layer is layers[-1] else f64_view(free, (m, *layer.out_shape))
                cur = layer.kind.truth(self, stream, layer, cur, target)
                if keep and layer.name in keep:
                    self.gpu.copy(keep[layer.name].rows(lo, hi), cur, stream)
            if cur.ptr != out.rows(lo, hi).ptr:  # a network that ends in a relu or a flatten
                self.gpu.copy(out.rows(lo, hi), cur, stream)

    def launch(self, stream, name: str, count: int, *args) -> None:
        self.kernels.launch(stream, name, count, *args)

    def weight(self, key: str) -> DeviceArray:
        return self.weights[key]

    def _scratch(self, name: str, elements: int) -> DeviceArray:
        held = self._compare.get(name)
        if held is None or math.prod(held.shape) < elements:
            held = self._compare[name] = self.gpu.alloc((max(elements, 1),), np.float64, lasting=True)
        return held

    def compare(self, y: DeviceArray, ref: DeviceArray, n: int, stream) -> RowStats:
        """y[:n] (the network's dtype) against ref[:n] (float64), image by image, on the device."""
        if y.dtype.name not in ("float32", "float64"):
            raise ConvsweepError(f"truth: cannot compare a {y.dtype.name} output (float32 or float64 expected)")
        per_image = math.prod(y.shape[1:])
        parts = max(1, min(MAX_PARTS, -(-per_image // PART_ELEMENTS)))
        part_rows = self._scratch("parts", n * parts * 7)
        rows = self._scratch("rows", n * 5)
        self.launch(stream, f"compare_parts_{DTYPE_SUFFIX[y.dtype.name]}", n * parts, part_rows.arg, y.arg, ref.arg,
                    np.int32(n), np.int64(per_image), np.int32(parts))
        self.launch(stream, "compare_rows", n, rows.arg, part_rows.arg, np.int32(n), np.int32(parts))
        host = np.empty((n, 5), np.float64)
        self.gpu.download(f64_view(rows, (n, 5)), host, stream)
        stream.sync()
        return RowStats(host[:, 0], host[:, 1], host[:, 2].astype(np.int64), host[:, 3].astype(np.int64), host[:, 4])


def host_sample(batch_size: int, flops_per_image: float) -> np.ndarray:
    """Which images of round 0 the host's float64 reference recomputes to check the device's: the first
    and the last, as many as HOST_CHECK_FLOPS buys (one at least)."""
    n = int(max(1, min(8, HOST_CHECK_FLOPS // max(flops_per_image, 1.0))))
    return np.unique(np.concatenate([np.arange(min(n, batch_size)), np.arange(max(batch_size - n, 0), batch_size)]))


def check_against_host(truth_logits: np.ndarray, host_logits: np.ndarray) -> float:
    """The normwise difference of the device's float64 truth from the host's on the same images; a
    ConvsweepError past HOST_CHECK_TOLERANCE (then no check this job makes could be trusted)."""
    from convsweep.model.checks import normwise_error

    difference = normwise_error(truth_logits, host_logits)
    if not difference <= HOST_CHECK_TOLERANCE:
        raise ConvsweepError(f"the GPU's float64 reference differs from the host's by {difference:.3g} normwise "
                             f"(at most {HOST_CHECK_TOLERANCE:g} expected): kernels/truth.cu or its launch is wrong")
    return difference
