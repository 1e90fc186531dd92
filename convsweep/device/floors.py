"""How far a time is from what this device can do: the floor of each thing a run times, at the rates
`convsweep bench` measured on the device (its `ceilings`), and the time's "× floor" over it.

The one owner of the formulas: the bench's table and the result store's `run_floor` rows both take
their floors from here.

- A conv layer (or a fused run of layers): its least bytes at the device-to-device copy rate, or its
  FLOPs at the measured matmul rate of the unit it computes on (`unit`: fp32 CUDA cores, tf32 or
  fp16 tensor cores), whichever is longer.
- The compute of a pass (`compute`): every timed layer's bytes at the copy rate, or their FLOPs each
  at its unit's rate, whichever is longer.
- The host-to-host pass (`forward`): a pipeline of three stages over the chunks, the input's bytes
  up at the pinned host-to-device rate, the compute, the logits down at the device-to-host rate. No
  stage can start a chunk before the one before it has it, so the pass takes at least the longest
  stage plus the other two stages' share of the smallest chunk (its head and tail).

These are floors at measured rates, not the peak-rate floors the integrity checks hold times to
(convsweep.device.peaks): a kernel may come within a few % of them, and one doing fewer FLOPs than the direct
convolution (an FFT) may go under its FLOP term.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

UNITS = ("fp32", "tf32", "fp16")  # the units whose matmul rate the bench measures, slowest first


def fastest_unit(units: Iterable[str | None]) -> str | None:
    """The fastest of several kernels' units: a floor over all of them errs low with it."""
    return max(units, key=lambda u: UNITS.index(u) if u in UNITS else len(UNITS), default=None)


@dataclass(frozen=True)
class Ceiling:
    """One device's measured rates, bytes and FLOPs per second (None: not measured)."""

    gpu: str | None
    dtod_bytes_per_s: float  # read + write: the rate a kernel's least bytes move at
    h2d_bytes_per_s: float | None = None  # pinned host -> device
    d2h_bytes_per_s: float | None = None  # device -> pinned host
    flops_per_s: Mapping[str, float] = field(default_factory=dict)  # unit -> dense matmul rate

    def rate(self, unit: str | None) -> float | None:
        """The matmul rate of `unit`; for a unit not measured, the fastest measured (a floor errs low)."""
        if unit in self.flops_per_s:
            return self.flops_per_s[cast(str, unit)]
        return max(self.flops_per_s.values(), default=None)


@dataclass(frozen=True)
class Work:
    """What a timed thing must do at least: bytes moved, FLOPs, and the unit that computes them."""

    bytes: int | None
    flops: int | None = None
    unit: str | None = None


def work_floor_ms(ceiling: Ceiling, work: Work) -> float | None:
    """The least time of `work`: its bytes at the copy rate or its FLOPs at its unit's rate."""
    return compute_floor_ms(ceiling, [work])


def compute_floor_ms(ceiling: Ceiling, works: Iterable[Work]) -> float | None:
    """The least time of several works done one after another or at once: all their bytes at the
    copy rate, or their FLOPs each at its unit's rate, whichever is longer. None without bytes."""
    works = list(works)
    if not works or any(w.bytes is None for w in works):
        return None
    memory_s = sum(cast(int, w.bytes) for w in works) / ceiling.dtod_bytes_per_s
    compute_s = 0.0
    for w in works:
        rate = ceiling.rate(w.unit)
        if w.flops and rate:
            compute_s += w.flops / rate
    return max(memory_s, compute_s) * 1e3


def forward_floor_ms(ceiling: Ceiling, shipped_bytes: int | None, logits_bytes: int | None, compute_ms: float | None,
                     tail_fraction: float = 1.0) -> float | None:
    """The least time of a host-to-host pass: the input up, the compute, the logits down, pipelined
    over chunks whose smallest is `tail_fraction` of the batch (1: one chunk, nothing overlaps). None
    where a rate or an amount is unknown."""
    if shipped_bytes is None or logits_bytes is None or compute_ms is None or not ceiling.h2d_bytes_per_s:
        return None
    down_rate = ceiling.d2h_bytes_per_s or ceiling.h2d_bytes_per_s
    stages = [shipped_bytes / ceiling.h2d_bytes_per_s * 1e3, compute_ms, logits_bytes / down_rate * 1e3]
    share = min(max(tail_fraction, 0.0), 1.0)
    return max(stage + share * (sum(stages) - stage) for stage in stages)


def times_floor(ms: float | None, floor_ms: float | None) -> float | None:
    """The time over its floor: 1.2 is within 20% of what the device allows (None where either is unknown)."""
    return ms / floor_ms if ms and floor_ms else None
