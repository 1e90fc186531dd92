"""Inputs no kernel has seen: every timed pass runs on a round of images made for it, on the device, from a
seed drawn when the job starts, and checked to be visibly new before its time counts.

A round r >= 1 of a batch of B holds the dataset's images at places r*B .. r*B + B - 1 of its fixed
shuffled order (convsweep.inputs.data.shuffled; round 0, the seeds' batch, is places 0 .. B - 1), each perturbed
by kernels/truth.cu's `perturb_*` from (seed, r, place): a shift of a few pixels, a gain, a smooth field of
plane waves over the ink and a per-pixel jitter (`Perturbation`). A blank pixel stays blank, so
the digits stay digits on a blank background, and a kernel that exploits the zeros still sees them. Two
places of one round that hold the same image (a batch larger than the dataset) get perturbations of their
own, so a round never holds an image twice. The seed is drawn with `secrets` after the kernels are built
and loaded, and stored with the result: the round can be made again, bit for bit, to replay a run.

Visibly new: the truth of every image of a round is held against that of every earlier sighting of its
source image in the same scope (a setting's passes, a confirm job's rounds; `Ledger`): at least
FRESH_SHARE of the images must differ from each of them by more than FRESH_FACTOR times the loosest
tolerance of any precision class, so that a kept answer fails the check whichever class the kernel is.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass

import numpy as np

from convsweep.model.checks import TOLERANCE
from convsweep.inputs.data import shuffled
from .gpu import DeviceArray
from .truth import DTYPE_SUFFIX, TruthKernels

FRESH_SHARE = 0.99  # of a round's images that must be visibly new
FRESH_FACTOR = 2.0  # visibly: by more than this many times the loosest tolerance
FRESH_THRESHOLD = FRESH_FACTOR * max(TOLERANCE.values())
SIGNATURE_VALUES = 256  # of an image's truth a sighting keeps (every one of a classifier's logits)


@dataclass(frozen=True)
class Perturbation:
    """What perturb_* does to each image (kernels/truth.cu): a shift of up to `max_shift` pixels each way
    (blank where it comes in), a gain in [gain_lo, 1], `waves` plane waves scaling the ink by up to +-field together, and
    a per-pixel jitter of +-jitter. Chosen on LeNet-86 and mnist5k (tests/test_rounds.py holds them to it):
    of 1,000 images over 40 rounds, 99.8% stay more than 0.02 away from every earlier sighting."""

    max_shift: int = 3
    gain_lo: float = 0.5
    field: float = 0.6
    waves: int = 4
    jitter: float = 0.1

    def args(self) -> tuple:
        return (np.int32(self.max_shift), np.float32(self.gain_lo), np.float32(self.field), np.int32(self.waves),
                np.float32(self.jitter))


PERTURBATION = Perturbation()
# The stored 28x28 digits that u8-source ships: one of their pixels is three of the network's.
SOURCE_PERTURBATION = Perturbation(max_shift=1)


def draw_seed() -> int:
    """A 64-bit seed no kernel can know: drawn from the operating system's randomness when asked."""
    return secrets.randbits(64)


def round_sources(dataset_size: int, batch: int, r: int) -> np.ndarray:
    """Which dataset image each place of round r holds (round 0: data.batch_indices)."""
    return shuffled(dataset_size)[(r * batch + np.arange(batch)) % dataset_size]


class RoundMaker:
    """Makes rounds on the device: the dataset's images as the input's format ships them, uploaded once,
    and perturb_* of the format's element type. `seed` is the job's (draw_seed)."""

    def __init__(self, kernels: TruthKernels, shipped: np.ndarray, batch: int, seed: int, stream,
                 perturbation: Perturbation = PERTURBATION):
        self.kernels, self.gpu, self.batch, self.seed, self.perturbation = kernels, kernels.gpu, batch, seed, perturbation
        self.dataset_size = len(shipped)
        self.images = self.gpu.to_device(np.ascontiguousarray(shipped), stream)
        self.image_shape = tuple(shipped.shape[1:])
        self._sources = self.gpu.alloc((batch,), np.int64)
        self._staged = np.empty(batch, np.int64)

    def sources(self, r: int) -> np.ndarray:
        return round_sources(self.dataset_size, self.batch, r)

    def make(self, r: int, out: DeviceArray, stream) -> np.ndarray:
        """Round r (>= 1) into `out` (batch images in the shipped type), enqueued on `stream`; returns its
        sources (the dataset image of each place: their labels)."""
        sources = self.sources(r)
        self._staged[...] = sources
        self.gpu.upload(self._staged, self._sources, stream)
        c, h, w = (self.image_shape + (1, 1, 1))[:3] if len(self.image_shape) == 3 else (1, 1, self.image_shape[-1])
        count = self.batch * math.prod(self.image_shape)
        self.kernels.launch(stream, f"perturb_{DTYPE_SUFFIX[out.dtype.name]}", count, out.arg, self.images.arg,
                            self._sources.arg, np.int32(self.batch), np.int32(c), np.int32(h), np.int32(w),
                            np.uint64(self.seed), np.uint64(r), *self.perturbation.args())
        return sources

    def record(self) -> dict:
        """What a result keeps to make the rounds again: the seed (hex) and the perturbation."""
        return {"seed": f"{self.seed:016x}", "perturbation": asdict(self.perturbation)}


class Ledger:
    """Every sighting of each source image's truth in one scope (`reset` starts a new one): SIGNATURE_VALUES of
    each image's truth (evenly spaced through it) in seen[slot][source], and `sight` holds a round's
    against all before it (kernels/truth.cu sight and freshness)."""

    def __init__(self, kernels: TruthKernels, dataset_size: int, out_shape: tuple[int, ...]):
        self.kernels, self.gpu = kernels, kernels.gpu
        self.sources = dataset_size
        self.per_image = max(1, math.prod(out_shape))
        self.values = min(self.per_image, SIGNATURE_VALUES)
        self.stride = self.per_image // self.values
        self.seen: DeviceArray | None  # SIGNATURE_VALUES per source and slot, grown by _room
        self.capacity, self.seen = 0, None
        self.counts = np.zeros(dataset_size, np.int64)
        self._slots: DeviceArray | None = None
        self._sources: DeviceArray | None = None
        self._nearest: DeviceArray | None = None

    def reset(self) -> None:
        self.counts[:] = 0

    def _room(self, slots: int, stream) -> None:
        if slots <= self.capacity:
            return
        capacity = max(slots, 2 * self.capacity, 4)
        grown = self.gpu.alloc((capacity * self.sources * self.values,), np.float64, lasting=True)  # outlives a setting
        if self.seen is not None and self.counts.any():
            used = int(self.counts.max()) * self.sources * self.values
            self.gpu.copy(DeviceArray(grown.ptr, (used,), grown.dtype), DeviceArray(self.seen.ptr, (used,), grown.dtype),
                          stream)
        self.seen, self.capacity = grown, capacity

    def sight(self, truth: DeviceArray, sources: np.ndarray, stream, judge: bool = True) -> np.ndarray | None:
        """Keep the sightings of a round (truth [B, ...] float64 on the device, `sources` its dataset images);
        with `judge`, return each image's smallest relative difference from the earlier sightings of its source
        (1e308 where there is none)."""
        batch = len(sources)
        slots = self.counts[sources] + _occurrence(sources)
        self._room(int(slots.max()) + 1, stream)
        if self._slots is None or self._slots.shape[0] < batch:
            self._slots, self._sources = (self.gpu.alloc((batch,), np.int64, lasting=True) for _ in range(2))
            self._nearest = self.gpu.alloc((batch,), np.float64, lasting=True)
        # All allocated by now: seen by _room, the others above.
        assert self.seen is not None and self._slots is not None and self._sources is not None \
            and self._nearest is not None
        staged = np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(sources, np.int64)
        self.gpu.upload(staged[0], self._slots.rows(0, batch), stream)
        self.gpu.upload(staged[1], self._sources.rows(0, batch), stream)
        self.kernels.launch(stream, "sight", batch * self.values, self.seen.arg, truth.arg, self._sources.arg,
                            self._slots.arg, np.int32(batch), np.int64(self.per_image), np.int32(self.values),
                            np.int64(self.stride), np.int64(self.sources))
        np.add.at(self.counts, sources, 1)
        if not judge:
            stream.sync()  # the staged slots are read by the launch
            return None
        self.kernels.launch(stream, "freshness", batch, self._nearest.arg, self.seen.arg, self._sources.arg,
                            self._slots.arg, np.int32(batch), np.int32(self.values), np.int64(self.sources))
        nearest = np.empty(batch, np.float64)
        self.gpu.download(self._nearest.rows(0, batch), nearest, stream)
        stream.sync()
        return nearest


def _occurrence(values: np.ndarray) -> np.ndarray:
    """For each element, how many equal ones come before it (0 for the first of each value)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    rank = np.arange(len(values)) - np.repeat(starts, np.diff(np.r_[starts, len(values)]))
    out = np.empty_like(rank)
    out[order] = rank
    return out


def fresh_share(nearest: np.ndarray) -> float:
    """The share of a round's images visibly new: farther than FRESH_THRESHOLD from every earlier sighting."""
    return float(np.mean(nearest > FRESH_THRESHOLD)) if len(nearest) else 1.0
