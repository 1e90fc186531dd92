"""Numbers that cannot be gamed: every timed pass is a checked pass, its inputs are new to the
kernel, the device starts clean, and no time beats physics.

convsweep ranks kernels (in a course, or to pick a winner), so a number must be the time of the
work it names. Known ways to fake one, and what closes each here:

- a kernel that computes once and then returns (its buffer keeps the first pass's answer): every
  output is poisoned before each timed pass, outside its timing (logits NaN; the outputs of conv
  layers run on their own, +huge, which a ReLU or a max-pool cannot hide), and every timed pass's
  logits are checked against float64, a sample of each such layer's output too;
- a kernel that memoizes (by pointer, or by the values of its input): the timed passes run on
  rounds of inputs not seen earlier in the run (convsweep.inputs: later cycles of the dataset
  shifted by a pixel, each with its float64 reference), and the caching test, after MLPerf's
  TEST04, runs each of a few rounds never seen twice in a row (N1 N1 N2 N2 N3 N3: a drifting
  clock cannot favour either kind, and a cache of even one entry hits): second passes faster
  than first ones in every pair, by more than the run's own noise (at least 5%), make the run
  `suspect`;
- a persisting-L2 window left set by a kernel's library: the set-aside and every stream's window
  are read and reset before timing (the run says what it found) and read again after it;
- work on a stream the timer does not wait for: after each pass the device is asked to finish,
  and work still running makes the run `suspect` (under nsys, its kernel records of each pass are
  held against the events too: job.py);
- a time below the physical floor (convsweep.peaks): `suspect`.

`IntegrityObserver` is an observer of convsweep.timing's loop (its hooks poison before a pass
and check after it); `settle` turns what it found into the measurement's status. The switch
`checks: fast` (experiments.yaml) drops the expensive parts, fresh rounds and the caching test, and
every table says so beside a number measured that way.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .checks import Check, check_logits, check_output
from .network import reference_layer
from .numbers import median
from .record import Integrity, Measurement
from .timing import Observer, Reading

if TYPE_CHECKING:
    from .inputs import Batch
    from .runner import PipelineBuffers

CHECKS = ("full", "fast")  # experiments.yaml `checks`
CACHING_PASSES = 3  # fresh rounds the caching test runs twice each
CACHING_MIN_EFFECT = 0.05  # repeats must be faster by more than this (or the run's noise) to be suspect
CACHING_MIN_MS = 0.01  # and by more than this: a pass of tens of microseconds is mostly its launch's noise
MAX_FRESH_ROUNDS = 32
# The float64 reference of fresh rounds is computed on the host (once, then cached on disk): at most
# this many FLOPs of it per job, about 20,000 LeNet-86 images (batch 10000 gets two fresh rounds, both
# for the caching test).
REFERENCE_BUDGET_FLOPS = 2e11
# Work after a pass's end: past both of these, the pass left work running; the run is suspect where
# most timed passes did (IntegrityObserver._judge_idle). A synchronize right after a pass
# costs up to some 40 us more than a second one even when no work is left (the lent H200, bench and
# batch-100 jobs), and 40-70 us under a profiler (CUPTI injected, as nsys does): the probe looks for
# more than that. Under nsys, its own view of every stream (judge_nsys) holds the pass to its events
# within NSYS_SLACK, closer than the probe can.
IDLE_MIN_MS, IDLE_SHARE = 0.1, 0.05
IDLE_MIN_MS_PROFILED = 0.2
NSYS_SLACK = 0.05  # nsys's kernels of a pass may outlast its events by this share before the run is suspect
# Bytes that fill an output the kernel must overwrite: a large positive finite value in each dtype,
# which a ReLU passes and a max-pool picks, so an unwritten element spoils the logits downstream.
POISON_BYTE = {"float16": 0x7B, "float32": 0x7F, "float64": 0x7F}
FLOOR_REASON = "below the physical floor"


def fresh_rounds(batch_size: int, passes: int, checks: str, available: int, flops_per_image: float
                 ) -> tuple[int, int]:
    """(for the timed passes, for the caching test): how many rounds of fresh inputs a job gets, within
    what the dataset's shifted cycles can fill and the reference budget allows. The caching test comes
    first, two at least (one pair alone is too few to tell a cache from noise) and up to
    CACHING_PASSES; the timed passes get one each from what is left (none: they run on round 0, and
    the caching test is what guards them). `checks: fast`: none at all."""
    if checks == "fast":
        return 0, 0
    affordable = int(REFERENCE_BUDGET_FLOPS // max(batch_size * flops_per_image, 1.0))
    total = max(1, min(available, affordable, passes + CACHING_PASSES, MAX_FRESH_ROUNDS))
    caching = min(CACHING_PASSES, total, max(2, total - passes, total // 4))
    return min(passes, total - caching), caching


class Rounds:
    """The job's inputs by round on the host, in the pipeline's kind of host memory, their float64
    references, and which round the next pass uploads (`current`). Made once per job (the fresh
    rounds' references computed, or read from the cache, then), shared by its settings."""

    def __init__(self, gpu, batch: Batch, buffers: PipelineBuffers, fresh: tuple[int, int], host_memory: str):
        self.batch, self.base, self.current = batch, buffers, 0
        self.fresh, self.caching = fresh  # rounds 1..fresh for the timed passes, the next `caching` for the test
        self.inputs = [buffers.x_host]
        self.references = [batch.reference]
        self.indices = [batch.idx]
        for r in range(1, self.fresh + self.caching + 1):
            self.inputs.append(batch.round_images(r, gpu.host_array(buffers.x_host.shape, buffers.x_host.dtype,
                                                                    host_memory)))
            self.references.append(batch.round_reference(r))
            self.indices.append(batch.round_index(r))
        self._layers: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self._weights64: dict[str, np.ndarray] | None = None  # cast once for every sampled image

    def of_pass(self, i: int) -> int:
        """Timed pass i's round: fresh rounds in turn, round 0 where there are none."""
        return 1 + i % self.fresh if self.fresh else 0

    def buffers(self) -> PipelineBuffers:
        """The pipeline's buffers with the current round's images as its input."""
        return replace(self.base, x_host=self.inputs[self.current])

    def layer_outputs(self, r: int, position: int) -> dict[str, np.ndarray]:
        """Every layer's float64 output for one image of round r (computed once for all settings)."""
        key = (r, position)
        if key not in self._layers:
            if self._weights64 is None:
                self._weights64 = {k: v.astype(np.float64) for k, v in self.batch.weights.items()}
            x = self.inputs[r][position : position + 1].astype(np.float64)
            outputs = {}
            for layer in self.batch.network.layers:
                x = reference_layer(layer, self._weights64, x)
                outputs[layer.name] = x[0]
            self._layers[key] = outputs
        return self._layers[key]


@dataclass(frozen=True)
class LayerSample:
    """Rows of a conv step's own output kept in a lane after a pass (its last chunk's first and last
    image), and which images of the round they are."""

    layer: str  # the conv layer the step starts at
    last: str  # the layer whose output the buffer holds after the pass (the step's, or an in-place ReLU's after it)
    buffer: Any  # the lane's DeviceArray
    rows: tuple[int, ...]
    positions: tuple[int, ...]
    tolerance: float


def layer_samples(net, chunks: list[tuple[int, int]], lanes: int, tolerances: dict[str, float]) -> list[LayerSample]:
    """What of each conv step's own output (not the network's last) is checked after a pass."""
    samples = []
    loosest = 0.0
    steps = list(getattr(net, "steps", ()))
    for step in steps:
        if not step.layer.is_conv:
            continue
        loosest = max(loosest, tolerances.get(step.layer.name, 0.0))
        if step is steps[-1] or not step.layer.kind.owns_output:
            continue
        # What the buffer holds once the pass is done: the step's output, or that of the layers after it
        # that work in place (a ReLU).
        last = step.last
        for later in steps[steps.index(step) + 1:]:
            if later.layer.kind.owns_output:
                break
            last = later.last
        for lane in range(min(lanes, len(chunks))):
            lo, hi = [c for i, c in enumerate(chunks) if i % lanes == lane][-1]
            rows = tuple(dict.fromkeys((0, hi - lo - 1)))
            samples.append(LayerSample(step.layer.name, last.name, net.lanes[lane].outputs[step.layer.name],
                                       rows, tuple(lo + r for r in rows), loosest))
    return samples


class IntegrityObserver(Observer):
    """Checks each timed pass and watches the device around them (the module's docstring says
    what and why). `gpu` (convsweep.gpu.Gpu or a stand-in) poisons, reads back and probes; `net`
    the setting's network; `timed_pass` runs one more pass, waited for, and returns its reading (the
    caching test's); `pass_ms` is the part of a reading a kernel's caching would shorten."""

    def __init__(self, gpu, net, streams: list, chunks: list[tuple[int, int]], rounds: Rounds, variants: dict,
                 checks: str, timed_pass: Callable[[], Reading], pass_ms: Callable[[Reading], float]):
        self.gpu, self.net, self.streams, self.rounds, self.variants = gpu, net, streams, rounds, variants
        self.timed_pass, self.pass_ms = timed_pass, pass_ms
        self.found = Integrity(checks=checks)
        self.samples = layer_samples(net, chunks, len(streams), {k: v.tolerance for k, v in variants.items()})
        self.poison_byte = POISON_BYTE.get(np.dtype(rounds.base.logits_host.dtype).name, 0x7F)
        self.seed: Check | None = None
        self.seed_logits: np.ndarray | None = None
        self.failure: str | None = None
        self.all_ms: list[float] = []
        self.busy_after: list[tuple[int, float]] = []  # (timed pass, ms the device still worked after it)

    # -- the device's state ------------------------------------------------------------------
    def clean_device(self) -> None:
        """Before any pass of the setting: what persisting-L2 state is left, reset to none."""
        try:
            state = self.gpu.persisting_l2(self.streams)
            dirty = bool(state["persisting_l2_bytes"] or state["windows"])
            if dirty:
                self.gpu.reset_persisting_l2(self.streams)
            self.found.device_state = {**state, "reset": dirty, "problem": None}
        except Exception as e:  # a GPU or driver without persisting L2: the run says it could not tell
            self.found.device_state = {"persisting_l2_bytes": None, "windows": [], "reset": False,
                                       "problem": f"cannot read or reset the persisting-L2 state ({e})"}

    def _state_after(self) -> None:
        if (self.found.device_state or {}).get("problem"):
            return
        try:
            state = self.gpu.persisting_l2(self.streams)
        except Exception:
            return
        if state["persisting_l2_bytes"] or state["windows"]:
            self.found.reasons.append(
                f"a persisting-L2 set-aside ({state['persisting_l2_bytes']} bytes) or access-policy window "
                f"(streams {state['windows']}) was set during the timed passes")

    # -- one pass ----------------------------------------------------------------------------
    def _poison(self) -> None:
        """Outside any timing: NaN logits on the host and the device, +huge in each checked conv output."""
        stream, buffers = self.streams[0], self.rounds.base
        buffers.logits_host[...] = np.nan
        self.gpu.fill(buffers.logits_dev, 0xFF, stream)
        for sample in self.samples:
            self.gpu.fill(sample.buffer, self.poison_byte, stream)

    def _check(self, r: int) -> Check:
        """The pass just finished (round r): its logits, then each sampled conv output."""
        rounds = self.rounds
        check = check_logits(rounds.base.logits_host, rounds.references[r], rounds.batch.dataset.labels,
                             rounds.indices[r], self.variants.values())
        if check.status != "ok":
            return check
        stream = self.streams[0]
        for sample in self.samples:
            rows = [np.empty(sample.buffer.shape[1:], sample.buffer.dtype) for _ in sample.rows]
            for row, host in zip(sample.rows, rows):
                self.gpu.download(sample.buffer.rows(row, row + 1), host[None], stream)
            stream.sync()
            ref = np.stack([self.rounds.layer_outputs(r, p)[sample.last].reshape(-1) for p in sample.positions])
            layer = check_output(np.stack(rows).reshape(len(rows), -1), ref, sample.tolerance)
            if layer.status != "ok":
                return Check("incorrect", f"{sample.layer}'s output: {layer.error}", layer.max_rel_err)
        return check

    def _checked(self, what: str, r: int, failing_pass: int | None = None) -> None:
        check = self._check(r)
        self.found.checked_passes += failing_pass is not None
        if check.status != "ok" and self.failure is None:
            self.failure = f"{what}: {check.error}"
            self.found.failed_pass = failing_pass

    def seed_pass(self, run_pass: Callable[[], object]) -> None:
        """An untimed pass over round 0, the seeds' batch, checked: the run's accuracy is this pass's."""
        self.rounds.current = 0
        self._poison()
        run_pass()
        self.seed_logits = np.array(self.rounds.base.logits_host, copy=True)

    # -- the observer's hooks --------------------------------------------------------------------
    def before_pass(self, i: int) -> None:
        # Nothing left of what came before (a setting's set-up, stream-ordered frees, the last check's
        # copies): the probe after the pass then sees only what the pass itself left running.
        self.gpu.idle_wait_ms()
        self.rounds.current = self.rounds.of_pass(i)
        self._poison()

    def after_pass(self, i: int, reading: Reading) -> None:
        idle = self.gpu.idle_wait_ms()
        self.found.idle_wait_ms = max(self.found.idle_wait_ms or 0.0, idle)
        least = IDLE_MIN_MS_PROFILED if os.environ.get("CUDA_INJECTION64_PATH") else IDLE_MIN_MS
        if idle > max(least, IDLE_SHARE * reading.ms):
            self.busy_after.append((i, idle))
        self._checked(f"timed pass {i}", self.rounds.current, failing_pass=i)
        self.all_ms.append(self.pass_ms(reading))
        self.found.fresh_passes += i < self.rounds.fresh

    def finish(self, timed_s: float, again: Callable[[], None]) -> None:
        self._state_after()
        self._judge_idle()
        if not self.rounds.caching or not self.all_ms:
            return
        times: dict[bool, list[float]] = {True: [], False: []}  # repeated? -> pass times
        # First one pass, untimed, over a round the timed passes saw: the GPU idled while they were judged, and
        # the first pair's fresh pass would pay its clocks' climb back (batch 1 on the lent H100, fp16_ and
        # wgmma_fused_network alike: the first pair 0.71-0.79x, the later ones 0.90-1.19x).
        self.rounds.current = self.rounds.of_pass(0)
        self._poison()
        self.timed_pass()
        self._checked("the caching test's warm-up pass", self.rounds.current)
        for k in range(self.rounds.caching):
            r = self.rounds.fresh + 1 + k  # a round no pass has seen yet
            for again in (False, True):
                self.rounds.current = r
                self._warm_transfer(r)
                self._poison()
                times[again].append(self.pass_ms(self.timed_pass()))
                self._checked(f"caching-test pass {2 * k + again} ({'again' if again else 'fresh inputs'})", r)
        fresh, repeated = median(times[False]), median(times[True])
        threshold = max(CACHING_MIN_EFFECT, self._noise())
        ratio = repeated / fresh if fresh else None
        pairs = [b / a if a else None for a, b in zip(times[False], times[True])]
        self.found.caching = {"fresh_ms": fresh, "repeated_ms": repeated, "ratio": ratio, "threshold": threshold,
                              "passes": [len(times[False]), len(times[True])], "pair_ratios": pairs}
        # Every pair must say so: a cache makes each second pass fast, where noise (a slow host launch
        # behind a small kernel's events) makes one pair look like it now and then.
        if ratio is not None and fresh - repeated > CACHING_MIN_MS and all(p is not None and p < 1 - threshold
                                                                          for p in pairs):
            self.found.reasons.append(
                f"caching test: passes over inputs seen before took {ratio:.2f}x those over fresh inputs "
                f"({repeated:.3f} against {fresh:.3f} ms, more than the {threshold:.0%} noise allows)")

    def _warm_transfer(self, r: int) -> None:
        """Round r's images copied to the device, untimed, before each pass of its pair, alike: the first copy out of
        a host buffer is slower than the next (batch 10001 on 4 streams, pinned, on the lent H100: repeats 0.89x
        fresh, every pair), and the again pass had that for free. (Before the fresh pass alone, it slowed the
        fresh pass instead: 0.68-0.72x at batch 10000 on one pageable stream.) No kernel runs on them here, so
        nothing a kernel could have kept of them exists before the fresh pass."""
        self.gpu.upload(self.rounds.inputs[r], self.rounds.base.x_dev, self.streams[0])
        self.streams[0].sync()

    def _judge_idle(self) -> None:
        """Suspect where most timed passes left work running: work kept off the timer's streams
        gains only if it is there every pass, where a host hiccup in the probe's own timing (a
        collection, a preempted thread) hits a pass now and then."""
        busy, passes = self.busy_after, len(self.all_ms)
        if busy and 2 * len(busy) > passes:
            first, longest = busy[0][0], max(ms for _, ms in busy)
            self.found.reasons.append(
                f"work was still running on the GPU after {len(busy)} of {passes} timed passes (up to {longest:.3f} "
                f"ms, from pass {first} on): a stream the timer does not wait for")

    def _noise(self) -> float:
        """The run's own noise, for the caching test: the largest deviation from their median of the
        timed passes of one kind (those over rounds seen before where there are three, else all of
        them: fresh, or all on round 0), so that a cache's effect on the timed passes is not taken
        for noise. The largest, not a typical one: the test compares medians of two or three."""
        again = self.all_ms[self.rounds.fresh:]
        steady = again if len(again) >= 3 else self.all_ms
        centre = median(steady)
        return max(abs(t / centre - 1) for t in steady) if centre else 0.0

    def apply(self, record: Measurement) -> None:
        """Into a checked measurement: what was found, and a wrong pass as its verdict."""
        record.integrity = self.found
        if self.failure is not None:
            record.status, record.error = "incorrect", self.failure


# -- verdicts on a finished measurement ---------------------------------------------------------
def judge_floors(m: Measurement, network) -> None:
    """Hold each conv layer's op time and the forward pass to their physical floors at the device's
    peaks (m.integrity.peaks, convsweep.peaks); one below is a reason to suspect the run. Run again
    when the times change (nsys replaces the events'): the floor reasons are worked out afresh."""
    from .peaks import Peaks, floor_ms, forward_floor_ms

    dtype, found = network.dtype, m.integrity
    if found is None or not found.peaks or not m.timings:
        return
    peaks = Peaks.from_json(found.peaks)
    floors = m.floors or {}
    found.reasons = [r for r in found.reasons if FLOOR_REASON not in r]
    found.floor_ms = {}
    for layer, floor in floors.items():
        found.floor_ms[layer] = floor_ms(peaks, floor["flops"], floor["bytes"], dtype)
    images = m.images or {}
    input_bytes = images.get("input_bytes")  # in the input's format; results before it: the network's dtype
    if input_bytes is None:
        input_bytes = (images.get("batch") or 0) * math.prod(network.input_shape) * np.dtype(dtype).itemsize
    found.floor_ms["forward"] = forward_floor_ms(peaks, sum(f["flops"] for f in floors.values()),
                                                 sum(f["bytes"] for f in floors.values()), input_bytes, dtype)
    times = {**(m.timings.op_time_ms or {}), "forward": m.timings.forward_ms}
    for what, floor in found.floor_ms.items():
        ms = times.get(what)
        if ms is not None and floor and ms < floor:
            found.reasons.append(f"{what} took {ms:.4g} ms, {FLOOR_REASON} of {floor:.4g} ms at this GPU's peak rates")


def judge_nsys(m: Measurement, nsys_forward_ms: float | None) -> None:
    """Under nsys: the pass's GPU work as nsys saw it (on every stream) against the events' time.
    Work the events did not wait for makes nsys's span the longer: past NSYS_SLACK, suspect."""
    events = m.timings.event_forward_ms if m.timings else None
    if m.integrity is None or events is None or nsys_forward_ms is None or not math.isfinite(nsys_forward_ms):
        return
    if nsys_forward_ms > events * (1 + NSYS_SLACK):
        m.integrity.reasons.append(f"nsys saw {nsys_forward_ms:.4g} ms of GPU work a pass where the events timed "
                                   f"{events:.4g} ms: work on a stream the timer does not wait for")


def settle(m: Measurement) -> None:
    """The measurement's status from its checks: a wrong timed pass makes it incorrect; otherwise
    any reason to doubt a number makes an ok run suspect (and back, if the reasons are gone)."""
    found = m.integrity
    if found is None or m.status not in ("ok", "suspect"):
        return
    if found.reasons:
        m.status, m.error = "suspect", "; ".join(found.reasons)
    else:
        m.status, m.error = "ok", None
