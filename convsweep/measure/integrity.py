"""Numbers that cannot be gamed: every timed pass is a checked pass on inputs no kernel has seen, the
device starts clean, and no time beats physics.

convsweep ranks kernels (in a course, or to pick a winner), so a number must be the time of the work it
names. A kernel is untrusted device code that wants a smaller time: assume it knows the harness, the
dataset, the weights and every fixed input, and keeps state anywhere on the device between launches.
What it cannot know is what it has not been shown. So, for every timed pass:

- its inputs are a round made for it (convsweep.device.rounds: the dataset's images perturbed from a seed drawn
  when the job started), checked to be visibly new against every earlier sighting of each image in the
  setting; a round that is not is not counted, and the pass is timed again on another. A memo (by
  address, by value, by part of the input, waiting for a third sighting, keyed on a fixed batch) has
  nothing to hit, and a kept answer is wrong;
- its outputs are poisoned before it, outside its timing (logits NaN; the conv layers' own outputs
  +huge, which a ReLU or a max-pool cannot hide; every workspace NaN), and after it the logits the host
  received are compared with the float64 truth of exactly what was shipped, computed on the GPU after
  the pass (convsweep.device.truth), with a sample of each conv layer's own output: a kernel that computes
  once, writes part of its output, or reads what it left in its workspace, is wrong;
- the device is asked to finish: work still running on a stream the timer does not wait for, after
  most timed passes, makes the run `suspect` (under nsys, its kernel records are held to the events too:
  job.py);
- the persisting-L2 set-aside and every stream's access-policy window are read and reset before timing
  (the run says what it found) and read again after it;
- a time below the physical floor (convsweep.device.peaks) is `suspect`.

With `checks: full` the caching test, after MLPerf's TEST04, then shows a memo of any depth: each of a
few fresh rounds is timed SIGHTINGS times in a row, and later sightings faster than first ones, in every
round, by more than the run's own noise, make the run `suspect`. `checks: fast` drops it, and only it:
its passes are the only ones not needed for a number (they cost SIGHTINGS passes a round, `caching_rounds`).

`IntegrityObserver` is an observer of convsweep.measure.timing's loop (its hooks make and check the rounds
around each pass); `settle` turns what it found into the measurement's status.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import numpy as np

from convsweep.model.checks import Check, check_output, verdict
from convsweep.base.errors import ConvsweepError
from convsweep.base.numbers import median, middle
from .record import Integrity, Measurement
from convsweep.device.rounds import (FRESH_SHARE, FRESH_THRESHOLD, PERTURBATION, SOURCE_PERTURBATION, Ledger, RoundMaker,
                     draw_seed, fresh_share)
from .timing import Observer, Reading

if TYPE_CHECKING:
    from convsweep.inputs.batch import Batch
    from .runner import PipelineBuffers
    from convsweep.device.truth import Truth

CHECKS = ("full", "fast")  # experiments.yaml `checks`
# Fresh rounds the caching test times SIGHTINGS times each: CACHING_ROUNDS, and for short passes more, until it times
# about CACHING_TIMED_MS. An honest 0.1-0.2 ms pass has every later sighting of 3 rounds 5-11% quicker now and then
# (the lent H100's default sweep: 1 run in 37 `suspect`, fp16_sliding_window at batch 1000); in all of 9, none of 16.
CACHING_ROUNDS = 3
CACHING_ROUNDS_MAX = 9
CACHING_TIMED_MS = 15.0
SIGHTINGS = 3  # a memo that fills on the second sighting serves the third
CACHING_MIN_EFFECT = 0.05  # later sightings must be faster by more than this (or the run's noise) to be suspect
CACHING_MIN_MS = 0.01  # and by more than this: a pass of tens of microseconds is mostly its launch's noise
MAX_STALE_ROUNDS = 4  # rounds of a setting that may fail to be visibly new before the setting fails
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
WORKSPACE_POISON = 0xFF  # NaN in every float type: a workspace read before it is written spoils the output
FLOOR_REASON = "below the physical floor"


@dataclass
class Slot:
    """Where one round lives: made on the device (`made`), shipped from the host (`shipped`, in the
    pipeline's kind of host memory); `round` and `sources` say which round and images it holds."""

    made: Any
    shipped: np.ndarray
    round: int | None = None
    sources: np.ndarray | None = None


class Rounds:
    """A job's inputs pass by pass, and their truth: round 0 (the seeds' batch, public, never timed) and a
    fresh round for each timed pass (`fresh`), made on the device into one of two slots while the last
    one's truth is worked out (`make_next`). Shared by the job's settings; each round is made once."""

    def __init__(self, gpu, truth: Truth, maker: RoundMaker, batch: Batch, buffers: PipelineBuffers, host_memory: str,
                 stream, ledger: Ledger):
        self.gpu, self.truth, self.maker, self.batch, self.base, self.ledger = gpu, truth, maker, batch, buffers, ledger
        self.stream, self.side = stream, gpu.stream()  # the truth's stream, and the next round's
        size, shape = batch.size, truth.out_shape
        self.labels = batch.dataset.labels
        self.round0 = Slot(gpu.to_device(batch.images, stream), buffers.x_host, 0, np.asarray(batch.idx))
        self.slots = [Slot(gpu.alloc(buffers.x_host.shape, buffers.x_host.dtype),
                           gpu.host_array(buffers.x_host.shape, buffers.x_host.dtype, host_memory)) for _ in range(2)]
        self.reference0 = gpu.alloc((size, *shape), np.float64)
        truth.forward(self.round0.made, size, self.reference0, stream)
        self.reference = gpu.alloc((size, *shape), np.float64)  # the current fresh round's truth
        self.received = gpu.alloc((size, *shape), buffers.logits_host.dtype)  # the logits the host received
        self._ready: Slot | None  # the round make_next made, not yet current
        self._truth_of: int | None  # the round whose truth self.reference holds
        self.current, self.next_round, self._ready, self._truth_of = self.round0, 1, None, None
        self.truth_accuracy: float | None = None  # the truth's own, on the round last judged
        self._picked: dict = {}  # truth_of_images' buffers

    # -- which round a pass runs on ---------------------------------------------------------------------------
    def use_round0(self) -> None:
        self.current = self.round0

    def fresh(self, ship: bool = True) -> Slot:
        """The next round, made (and with `ship`, copied to its host buffer, which the pass uploads) or the one
        `make_next` made, now current."""
        slot = self._ready or self._make(self.slots[0] if self.current is not self.slots[0] else self.slots[1], ship)
        self.side.sync()
        self._ready, self.current = None, slot
        return slot

    def make_next(self, ship: bool = True) -> None:
        """Start making the round after this one in the other slot, on the side stream (outside any timing)."""
        if self._ready is None:
            self._ready = self._make(self.slots[1] if self.current is self.slots[0] else self.slots[0], ship)

    def _make(self, slot: Slot, ship: bool) -> Slot:
        r, self.next_round = self.next_round, self.next_round + 1
        slot.round, slot.sources = r, self.maker.make(r, slot.made, self.side)
        if ship:
            self.gpu.download(slot.made, slot.shipped, self.side)
        return slot

    def key(self) -> int:
        """Which host buffer the current round ships from (a graph is captured once per buffer)."""
        return 0 if self.current is self.round0 else 1 + self.slots.index(self.current)

    def buffers(self) -> PipelineBuffers:
        return replace(self.base, x_host=self.current.shipped)

    # -- what a pass on it computed ---------------------------------------------------------------------------------
    def reference_now(self, again: bool = False):
        """The current round's truth on the device, worked out once per round (after its first pass); `again`:
        worked out anew (the caching test's same device work before every sighting)."""
        if self.current is self.round0:
            return self.reference0
        if again or self._truth_of != self.current.round:
            self.truth.forward(self.current.made, self.batch.size, self.reference, self.stream)
            self._truth_of = self.current.round
        return self.reference

    def judge(self, variants, logits=None) -> Check:
        """The logits the host received from the last pass (or `logits`, on the device) against the current
        round's truth, on the device."""
        if logits is None:
            self.gpu.upload(self.base.logits_host, self.received, self.stream)
        stats = self.truth.compare(self.received if logits is None else logits, self.reference_now(), self.batch.size,
                                   self.stream)
        labels = None if self.labels is None else self.labels[self.current.sources]
        self.truth_accuracy = None if labels is None else float(np.mean(stats.expected == labels))
        return verdict(stats, labels, variants)

    def truth_of_images(self, positions: tuple[int, ...], layers: list[str]) -> dict[str, np.ndarray]:
        """Every named layer's float64 output for images `positions` of the current round: [len, ...] each."""
        made, n, network = self.current.made, len(positions), self.batch.network
        key = (n, tuple(layers))
        if key not in self._picked:  # the same few images of every pass of the job: made once, outlive a setting
            alloc = self.gpu.alloc
            self._picked[key] = (alloc((n, *made.shape[1:]), made.dtype, lasting=True),
                                 {name: alloc((n, *network.layer(name).out_shape), np.float64, lasting=True)
                                  for name in layers},
                                 alloc((n, *self.truth.out_shape), np.float64, lasting=True))
        picked, keep, out = self._picked[key]
        for i, position in enumerate(positions):
            self.gpu.copy(picked.rows(i, i + 1), made.rows(position, position + 1), self.stream)
        self.truth.forward(picked, n, out, self.stream, keep)
        found = {}
        for name, array in keep.items():
            found[name] = np.empty(array.shape, np.float64)
            self.gpu.download(array, found[name], self.stream)
        self.stream.sync()
        return found

    @overload
    def sight(self, judge: Literal[True] = True) -> float: ...
    @overload
    def sight(self, judge: bool) -> float | None: ...

    def sight(self, judge: bool = True) -> float | None:
        """The current round's truth into the setting's ledger; with `judge`, the share of its images visibly new."""
        assert self.current.sources is not None  # round 0's, or set when its round was made
        nearest = self.ledger.sight(self.reference_now(), self.current.sources, self.stream, judge)
        return None if nearest is None else fresh_share(nearest)

    def new_scope(self) -> None:
        """A setting starts: its ledger holds round 0's sightings alone."""
        self.ledger.reset()
        self.ledger.sight(self.reference0, cast(np.ndarray, self.round0.sources), self.stream, judge=False)


def open_rounds(gpu, arch: str, batch: Batch, buffers: PipelineBuffers, host_memory: str, stream) -> Rounds:
    """A job's rounds on its open GPU: the truth's kernels (built for `arch`) and weights, the seed drawn now, round
    0's truth, held to the host's float64 reference on its first and last images (convsweep.device.truth: a wrong truth
    would make every check a lie)."""
    from convsweep.model.network import reference_forward
    from convsweep.device.truth import Truth, TruthKernels, check_against_host, host_sample
    from convsweep.model.variants import layer_flops

    kernels = TruthKernels(gpu, arch)
    truth = Truth(kernels, batch.network, batch.weights, stream)
    maker = RoundMaker(kernels, batch.shipped, batch.size, draw_seed(), stream,
                       SOURCE_PERTURBATION if batch.input_format.source else PERTURBATION)
    rounds = Rounds(gpu, truth, maker, batch, buffers, host_memory, stream,
                    Ledger(kernels, len(batch.shipped), truth.out_shape))
    sample = host_sample(batch.size, sum(layer_flops(layer) for layer in batch.network.layers))
    device = np.empty((len(sample), *truth.out_shape), np.float64)
    for i, position in enumerate(sample):
        gpu.download(rounds.reference0.rows(int(position), int(position) + 1), device[i : i + 1], stream)
    stream.sync()
    host = reference_forward(batch.network, batch.weights, batch.images[sample], dtype=np.float64, quiet=True)
    check_against_host(device, host)
    return rounds


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


def workspaces(net) -> list:
    """Every conv workspace of the network's lanes (the variants' scratch, poisoned before each pass)."""
    return [w for lane in getattr(net, "lanes", ()) for w in getattr(lane, "workspaces", {}).values() if w is not None]


def caching_rounds(pass_ms: float) -> int:
    """How many rounds the caching test times: CACHING_ROUNDS, and more (up to CACHING_ROUNDS_MAX) where passes are
    short, until its passes add up to CACHING_TIMED_MS. A memo is quicker in every round; noise in all of 9 is rare."""
    if not pass_ms > 0:
        return CACHING_ROUNDS
    return max(CACHING_ROUNDS, min(CACHING_ROUNDS_MAX, math.ceil(CACHING_TIMED_MS / (SIGHTINGS * pass_ms))))


class IntegrityObserver(Observer):
    """Checks each timed pass and watches the device around them (the module's docstring says
    what and why). `gpu` (convsweep.device.gpu.Gpu or a stand-in) poisons, reads back and probes; `net`
    the setting's network; `timed_pass` runs one more pass, waited for, and returns its reading (the
    caching test's); `pass_ms` is the part of a reading a kernel's caching would shorten."""

    def __init__(self, gpu, net, streams: list, chunks: list[tuple[int, int]], rounds: Rounds, variants: dict,
                 checks: str, timed_pass: Callable[[], Reading], pass_ms: Callable[[Reading], float]):
        self.gpu, self.net, self.streams, self.rounds, self.variants = gpu, net, streams, rounds, variants
        self.timed_pass, self.pass_ms = timed_pass, pass_ms
        self.found = Integrity(checks=checks, rounds=[], freshness={"threshold": FRESH_THRESHOLD, "share": None,
                                                                      "stale_rounds": 0})
        self.samples = layer_samples(net, chunks, len(streams), {k: v.tolerance for k, v in variants.items()})
        self.workspaces = workspaces(net)
        self.poison_byte = POISON_BYTE.get(np.dtype(rounds.base.logits_host.dtype).name, 0x7F)
        self.seed: Check | None = None
        self.seed_logits: np.ndarray | None = None
        self.failure: str | None = None
        self.all_ms: list[float] = []
        self.accuracy: list[tuple[float, float | None]] = []  # (the kernel's, the truth's) on each timed round
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
        """Outside any timing: NaN logits on the host and the device, +huge in each checked conv output, NaN
        in every workspace."""
        stream, buffers = self.streams[0], self.rounds.base
        buffers.logits_host[...] = np.nan
        self.gpu.fill(buffers.logits_dev, 0xFF, stream)
        for sample in self.samples:
            self.gpu.fill(sample.buffer, self.poison_byte, stream)
        for workspace in self.workspaces:
            self.gpu.fill(workspace, WORKSPACE_POISON, stream)
        stream.sync()

    def _check(self) -> Check:
        """The pass just finished: its logits against the round's truth, then each sampled conv output."""
        check = self.rounds.judge(self.variants.values())
        if check.status != "ok" or not self.samples:
            return check
        stream = self.streams[0]
        truth = self.rounds.truth_of_images(tuple(dict.fromkeys(p for s in self.samples for p in s.positions)),
                                            list(dict.fromkeys(s.last for s in self.samples)))
        order = list(dict.fromkeys(p for s in self.samples for p in s.positions))
        for sample in self.samples:
            rows = [np.empty(sample.buffer.shape[1:], sample.buffer.dtype) for _ in sample.rows]
            for row, host in zip(sample.rows, rows):
                self.gpu.download(sample.buffer.rows(row, row + 1), host[None], stream)
            stream.sync()
            ref = np.stack([truth[sample.last][order.index(p)].reshape(-1) for p in sample.positions])
            layer = check_output(np.stack(rows).reshape(len(rows), -1), ref, sample.tolerance)
            if layer.status != "ok":
                return Check("incorrect", f"{sample.layer}'s output: {layer.error}", layer.max_rel_err)
        return check

    def _checked(self, what: str, failing_pass: int | None = None) -> Check:
        check = self._check()
        self.found.checked_passes += failing_pass is not None
        if check.status != "ok" and self.failure is None:
            self.failure = f"{what}: {check.error}"
            self.found.failed_pass = failing_pass
        return check

    def seed_pass(self, run_pass: Callable[[], object]) -> Check:
        """An untimed pass over round 0, the seeds' batch, checked: the run's accuracy is this pass's."""
        self.rounds.use_round0()
        self.rounds.new_scope()
        self._poison()
        run_pass()
        self.seed_logits = np.array(self.rounds.base.logits_host, copy=True)
        self.seed = self.rounds.judge(self.variants.values())
        return self.seed

    # -- the observer's hooks --------------------------------------------------------------------
    def before_pass(self, i: int) -> None:
        # Nothing left of what came before (a setting's set-up, stream-ordered frees, the last check's
        # copies, the next round in the making): the probe after the pass then sees only what the pass left.
        self.rounds.fresh()
        self.gpu.idle_wait_ms()
        self._poison()

    def after_pass(self, i: int, reading: Reading) -> bool:
        idle = self.gpu.idle_wait_ms()
        self.found.idle_wait_ms = max(self.found.idle_wait_ms or 0.0, idle)
        least = IDLE_MIN_MS_PROFILED if os.environ.get("CUDA_INJECTION64_PATH") else IDLE_MIN_MS
        if idle > max(least, IDLE_SHARE * reading.ms):
            self.busy_after.append((i, idle))
        self.rounds.reference_now()  # the truth first: then the next round is made beside the check
        self.rounds.make_next()
        check = self._checked(f"timed pass {i}", failing_pass=i)
        share = self.rounds.sight()
        freshness = self.found.freshness
        assert freshness is not None and self.found.rounds is not None  # set in __init__
        freshness["share"] = share if freshness["share"] is None else min(freshness["share"], share)
        if share < FRESH_SHARE:  # not a round no kernel has seen: its time does not count
            freshness["stale_rounds"] += 1
            if freshness["stale_rounds"] > MAX_STALE_ROUNDS:
                raise ConvsweepError(f"{freshness['stale_rounds']} rounds were not visibly new (the last: {share:.1%} of "
                                     f"its images more than {FRESH_THRESHOLD:g} from every earlier sighting): the "
                                     "perturbation (convsweep.device.rounds) is too weak for this network")
            return False
        self.found.rounds.append(cast(int, self.rounds.current.round))  # a made round's
        if check.accuracy is not None:
            self.accuracy.append((check.accuracy, self.rounds.truth_accuracy))
        self.all_ms.append(self.pass_ms(reading))
        self.found.fresh_passes += 1
        return True

    def finish(self, timed_s: float, again: Callable[[], None]) -> None:
        self._state_after()
        self._judge_idle()
        if self.accuracy:
            self.found.fresh_accuracy = float(np.mean([a for a, _ in self.accuracy]))
            self.found.fresh_truth_accuracy = float(np.mean([a for _, a in self.accuracy]))
        if self.found.checks == "fast" or not self.all_ms:
            return
        # First one pass, untimed, over a round the timed passes saw: the GPU idled while they were judged, and
        # the first round's first sighting would pay its clocks' climb back (batch 1 on the lent H100, fp16_ and
        # wgmma_fused_network alike: the first pair 0.71-0.79x, the later ones 0.90-1.19x).
        self._poison()
        self.timed_pass()
        self._checked("the caching test's warm-up pass")
        # Every sighting follows the same device work: the round's float64 truth, worked out before each. Where it
        # came only after the first (its check), the later sightings followed the truth's work and the first did
        # not (fp16_fused_network at batch 512 on the lent H100, alone on it: the second 0.84x the first in each of
        # 3 rounds, 0.052 against 0.062 ms, `suspect`). Short honest passes still show later sightings a few percent
        # quicker now and then, which more rounds outvote (caching_rounds). The truth is the harness's own work.
        times: list[list[float]] = [[] for _ in range(SIGHTINGS)]  # [sighting][round]
        for k in range(caching_rounds(median(self.all_ms) or 0.0)):
            self.rounds.fresh()
            for sighting in range(SIGHTINGS):
                self.rounds.reference_now(again=True)
                if sighting == 0:
                    self.rounds.sight()
                self._warm_transfer()
                self._poison()
                times[sighting].append(self.pass_ms(self.timed_pass()))
                self._checked(f"caching-test round {k} sighting {sighting + 1}")
        self._judge_caching(times)

    def _judge_caching(self, times: list[list[float]]) -> None:
        """Later sightings of a round against its first: a memo that serves from sighting d is faster there in
        every round. Suspect where, for some d, every round's ratio is below 1 - threshold."""
        threshold = max(CACHING_MIN_EFFECT, self._noise())
        first = middle(times[0])  # each sighting's median is a number: one time a round
        later = [[b / a if a else None for a, b in zip(times[0], times[d])] for d in range(1, len(times))]
        worst = min((middle(times[d]) / first if first else 1.0) for d in range(1, len(times)))
        self.found.caching = {"sightings": len(times), "rounds": len(times[0]), "times_ms": times,
                              "ratios": later, "ratio": worst, "threshold": threshold}
        for d, ratios in enumerate(later, start=2):
            later_ms = middle(times[d - 1])
            faster = first - later_ms
            if faster > CACHING_MIN_MS and all(r is not None and r < 1 - threshold for r in ratios):
                self.found.reasons.append(
                    f"caching test: sighting {d} of a round took {later_ms / first:.2f}x its first "
                    f"({later_ms:.3f} against {first:.3f} ms, in each of {len(ratios)} rounds, more than "
                    f"the {threshold:.0%} noise allows)")
                break

    def _warm_transfer(self) -> None:
        """The current round's images copied to the device, untimed, before each sighting alike: the first copy out
        of a host buffer is slower than the next (batch 10001 on 4 streams, pinned, on the lent H100: repeats 0.89x
        fresh, every pair), and a repeat had that for free. (Before the fresh pass alone, it slowed the fresh pass
        instead: 0.68-0.72x at batch 10000 on one pageable stream.) No kernel runs on them here, so nothing a
        kernel could have kept of them exists before the first sighting."""
        self.gpu.upload(self.rounds.current.shipped, self.rounds.base.x_dev, self.streams[0])
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
        """The run's own noise, for the caching test: the largest deviation of a timed pass from their
        median, so that a cache's effect is not taken for noise. The largest, not a typical one: the test
        compares medians of a few."""
        centre = median(self.all_ms)
        return max(abs(t / centre - 1) for t in self.all_ms) if centre else 0.0

    def apply(self, record: Measurement) -> None:
        """Into a checked measurement: what was found, and a wrong pass as its verdict."""
        record.integrity = self.found
        if self.failure is not None:
            record.status, record.error = "incorrect", self.failure


# -- verdicts on a finished measurement ---------------------------------------------------------
def judge_floors(m: Measurement, network) -> None:
    """Hold each conv layer's op time and the forward pass to their physical floors at the device's
    peaks (m.integrity.peaks, convsweep.device.peaks); one below is a reason to suspect the run. Run again
    when the times change (nsys replaces the events'): the floor reasons are worked out afresh."""
    from convsweep.device.peaks import Peaks, floor_ms, forward_floor_ms

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
