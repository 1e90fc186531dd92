"""The input's format: what the host holds and the bus carries, and what the device makes of it.

A pass ships its batch from host to device; at batch 10000 the fp32 images are 296 MB, and the end
to end is bound by the bus, not the kernels. The `input_format` axis (convsweep.base.axes) picks what
crosses it:

- fp32: the network's input itself (4 bytes a pixel).
- fp16: the same images rounded to half (2 bytes). Lossless for the fp16 kernels, which round their
  input to half anyway.
- u8: the images rounded to the 1/255 grid (1 byte). Lossy: the bilinear upscale's values fall
  between the grid's points, by up to 1/510 a pixel.
- u8-source: the dataset's stored digits, 28x28 bytes, upscaled on the device (a tenth of u8's
  bytes). Exact: the 86x86 input is a bilinear upscale of them (convsweep.inputs.data).

The host holds the batch in its format, prepared once; the device's first step (a `convert` or
`upsample` layer, convsweep.model.layers and kernels/layers.cu) makes the network's input from it. The
float64 reference runs the same first layer on exactly what was shipped, so a run is checked
against what its format carries and scored against the labels.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .data import RANDOM, Dataset
from convsweep.base.errors import ConfigError
from convsweep.model.layers import Layer
from convsweep.model.network import Network


@dataclass(frozen=True)
class InputFormat:
    name: str
    dtype: str  # what the host holds and the bus carries
    first_layer: str | None  # the layer type the device runs first (None: the input is the network's own)
    divisor: float = 1.0  # the first layer's y = x / divisor: 255 maps bytes onto [0, 1]
    source: bool = False  # ships the dataset's stored images, smaller than the network's input

    @property
    def identity(self) -> list:
        """What a cache key adds for this format (nothing for fp32: its caches predate the axis)."""
        return [] if self.name == FP32 else ["input", self.name]

    def ship(self, dataset: Dataset) -> np.ndarray:
        """Every image of the dataset as this format carries it [N, C, h, w]."""
        if self.source:
            assert dataset.raw is not None  # refused without them (network, refusal)
            return dataset.raw[:, None]
        if self.dtype == "uint8":
            return np.rint(dataset.images * np.float32(255.0)).astype(np.uint8)
        return dataset.images.astype(self.dtype, copy=False)  # fp32: the dataset's own array, no copy

    def network(self, network: Network, dataset: Dataset) -> Network:
        """`network` taking this format's input: the same network after a first layer (`input`) that
        makes its input from what was shipped, or the network itself for fp32."""
        if self.first_layer is None:
            return network
        why = self.refusal(network, dataset.name, dataset.raw is not None)
        if why:
            raise ConfigError(why)
        shape = network.input_shape
        if self.source:
            assert dataset.raw is not None  # refused above without them
            source = (shape[0], *dataset.raw.shape[1:])
            layer = Layer("input", "upsample", source, shape, size=shape[-1], divisor=self.divisor)
        else:
            layer = Layer("input", "convert", shape, shape, divisor=self.divisor)
        return replace(network, input_shape=layer.in_shape, input_dtype=self.dtype, layers=(layer, *network.layers))

    def refusal(self, network: Network, dataset: str | dict, has_source: bool = True) -> str | None:
        """Why this format cannot feed `network` from `dataset` (a name or IDX files), or None."""
        if not self.source:
            return None
        shape = network.input_shape
        if dataset == RANDOM or not has_source:
            return (f"input {self.name} ships a dataset's stored images, upscaled on the GPU; "
                    f"dataset {RANDOM} has none (use fp32, fp16 or u8)")
        if len(shape) != 3 or shape[0] != 1 or shape[1] != shape[2]:
            return (f"input {self.name} upscales one-channel square images on the GPU; "
                    f"{network.path.name} takes input {list(shape)}")
        return None


FP32 = "fp32"
FORMATS: dict[str, InputFormat] = {
    FP32: InputFormat(FP32, "float32", None),
    "fp16": InputFormat("fp16", "float16", "convert"),
    "u8": InputFormat("u8", "uint8", "convert", divisor=255.0),
    "u8-source": InputFormat("u8-source", "uint8", "upsample", divisor=255.0, source=True),
}
