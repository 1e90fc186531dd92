"""What a run computes on and is checked against: a batch of real (or seeded random) images, the
network's weights, and the float64 reference logits of every image, cached on disk.

A batch has rounds. Round 0 is the seeds' batch: the dataset's images in a fixed shuffled order,
cycled where the batch is larger than the dataset (batch 10000 of mnist5k holds each image twice),
so accuracy stays comparable with the course's numbers. Rounds 1, 2, ... are inputs a kernel has not
seen earlier in the run (convsweep.measure.integrity times its passes on them): they carry on through the
same shuffled order, each later cycle of the dataset shifted by a pixel or two (`SHIFTS`), so no two
images of any rounds are equal and a digit stays the digit its label says (the stored 28x28 digits
that u8-source ships keep their place: each cycle marks their blank corners with its number
instead). Every round is in the input's format (convsweep.inputs.formats); its float64 reference is
computed once, for its images only, and cached, like round 0's.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .data import Dataset, batch_indices, load_dataset, random_dataset, shuffled
from convsweep.base.fileio import SealedCache, canonical_hash
from .formats import FORMATS, FP32, InputFormat
from convsweep.model.network import Network, load_weights, reference_forward_parallel
from convsweep.base.paths import cache_dir


@dataclass(frozen=True)
class Batch:
    """What a run computes on: `idx` picks the batch's images (and labels) from the dataset, which
    the network runs with `weights`; `reference` is the float64 truth for exactly those images."""

    network: Network  # with its first layer for the input's format (InputFormat.network)
    dataset: Dataset
    weights: dict[str, np.ndarray]
    idx: np.ndarray
    input_format: InputFormat = FORMATS[FP32]

    @cached_property
    def shipped(self) -> np.ndarray:
        """Every image of the dataset as the input's format carries it."""
        return self.input_format.ship(self.dataset)

    @cached_property
    def images(self) -> np.ndarray:
        return np.ascontiguousarray(self.shipped[self.idx], dtype=self.network.shipped_dtype)

    @cached_property
    def reference(self) -> np.ndarray:
        return cached_forward(self.network, self.weights, [self.dataset.sha256, *self.input_format.identity],
                              lambda: self.shipped)[self.idx]

    @property
    def size(self) -> int:
        return len(self.idx)

    @property
    def fresh_rounds_available(self) -> int:
        """How many rounds after round 0 the shifted cycles can fill without an image repeating."""
        return len(SHIFTS) * len(self.dataset.images) // self.size

    def _positions(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(cycle, dataset image) of each image of round r >= 1: positions past the first cycle."""
        n = len(self.dataset.images)
        if not 1 <= r <= self.fresh_rounds_available:
            raise ValueError(f"round {r}: the dataset's shifted cycles fill rounds 1 to {self.fresh_rounds_available}")
        positions = n + (r - 1) * self.size + np.arange(self.size)
        return positions // n, shuffled(n)[positions % n]

    def round_images(self, r: int, out: np.ndarray | None = None) -> np.ndarray:
        """Round r's images as the input's format ships them (round 0: `images`), written into `out`
        where given (a pinned host buffer: one gather per cycle, no copy in between)."""
        if out is None:
            out = np.empty((self.size, *self.network.input_shape), dtype=self.network.shipped_dtype)
        if r == 0:
            out[...] = self.images
            return out
        cycles, idx = self._positions(r)
        for cycle in np.unique(cycles):
            here = np.nonzero(cycles == cycle)[0]
            if self.input_format.source:
                # A pixel of the stored 28x28 digit is three of the network's: a shift would move it
                # too far to stay its digit. Each later cycle marks the four blank corners instead.
                out[here] = self.shipped[idx[here]]
                out[here, ..., ::out.shape[-2] - 1, ::out.shape[-1] - 1] = int(cycle)
            else:
                out[here] = rolled(self.shipped, idx[here], SHIFTS[int(cycle) - 1])
        return out

    def round_reference(self, r: int) -> np.ndarray:
        """Round r's float64 reference logits (round 0: `reference`), computed once and cached."""
        if r == 0:
            return self.reference
        return cached_forward(self.network, self.weights,
                              [self.dataset.sha256, "round", r, self.size, *self.input_format.identity],
                              lambda: self.round_images(r))

    def round_index(self, r: int) -> np.ndarray:
        """Round r's images as indices into the dataset (their labels), shift or mark aside."""
        return self.idx if r == 0 else self._positions(r)[1]


# Each later cycle of the dataset moved by (rows, columns), wrapping round: one pixel, then two, in
# every direction. A digit of mnist5k has a blank border of a dozen pixels at 86x86, so it stays whole.
SHIFTS: tuple[tuple[int, int], ...] = tuple((dy, dx) for ring in (1, 2) for dy in range(-ring, ring + 1)
                                            for dx in range(-ring, ring + 1) if max(abs(dy), abs(dx)) == ring)


def rolled(images: np.ndarray, idx: np.ndarray, shift: tuple[int, int]) -> np.ndarray:
    """images[idx], each rolled by `shift` (rows, columns) as np.roll would, in one gather; 1-d
    inputs [N, F] roll along their features (by rows * 7 + columns, which tells every shift apart)."""
    if images.ndim == 4:
        h, w = images.shape[-2:]
        rows, cols = (np.arange(h) - shift[0]) % h, (np.arange(w) - shift[1]) % w
        return images[idx[:, None, None, None], np.arange(images.shape[1])[None, :, None, None],
                      rows[None, None, :, None], cols[None, None, None, :]]
    f = images.shape[-1]
    return images[idx[:, None], ((np.arange(f) - (shift[0] * 7 + shift[1])) % f)[None, :]]


def load_batch(network: Network, dataset_spec: str | dict, batch: int, input_format: str = FP32) -> Batch:
    """`batch` images of a named or IDX-file dataset (cycled when it has fewer), or of `random`
    (exactly the batch: those workloads are large per image), with the network's weights, as
    `input_format` ships them (convsweep.inputs.formats): the batch's network then starts with the layer
    that makes its input from them."""
    size = network.input_shape[-1]
    if dataset_spec == "random":
        dataset = random_dataset(network.input_shape, batch)
    elif isinstance(dataset_spec, dict):
        dataset = load_dataset(dataset_spec["name"], images=dataset_spec["images"], labels=dataset_spec["labels"],
                               image_size=size)
    else:
        dataset = load_dataset(dataset_spec, image_size=size)
    fmt = FORMATS[input_format]
    return Batch(fmt.network(network, dataset), dataset, load_weights(network), batch_indices(len(dataset.images), batch),
                 fmt)


def cached_forward(network: Network, weights: dict[str, np.ndarray], identity: list,
                   images: Callable[[], np.ndarray]) -> np.ndarray:
    """The float64 logits of `images()` (which `identity` names, with the network and its weights),
    from the disk cache where its entry is sound (fileio.SealedCache: sealed under the hash of all
    these, with the array's digest), or computed once and kept there."""
    weights_hash = hashlib.sha256(b"".join(k.encode() + v.tobytes() for k, v in sorted(weights.items()))).hexdigest()
    key = canonical_hash([identity[0], weights_hash, Path(network.path).read_text(), list(network.input_shape),
                          *identity[1:]])
    cache, name = SealedCache(cache_dir()), f"reference/{key}.sealed"
    logits = cache.read_array(name, key)
    if logits is not None and logits.dtype == np.float64:
        return logits
    logits = reference_forward_parallel(network, weights, images())
    cache.write_array(name, key, {"identity": identity, "weights_sha256": weights_hash,
                                  "network": Path(network.path).name}, logits)
    return logits
