"""How a pass is timed, what is watched around it, and when to stop: one sampling loop for jobs and
the bench, after Kernel Tuner's observers and nvbench's timers.

A `Timer` times one pass of a callable on one clock: the host's (`HostClock`, the CPU reference),
CUDA events on a stream (`CudaEvents`), the replay of a pass captured once as a CUDA graph
(`GraphReplay`) or PyTorch's events (`TorchEvents`). Timers take the GPU (or torch) they time on as
an argument. An `Observer` watches the timed passes through hooks (`start`, `before_pass`,
`after_pass`, `finish`, `results`): the NVML slowdowns and clocks (`HealthObserver`), the energy
counter (`EnergyObserver`) and the cold-L2 flush (`L2FlushObserver`). `sample` runs the untimed
warm-ups, then timed passes until a `StoppingRule` says stop; observers see every timed pass and
never a warm-up. Everything is passed in, so tests hand in stand-ins.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Protocol

from convsweep.base.heartbeat import beat
from convsweep.device.provenance import slowdown_names
from convsweep.base.stats import StoppingRule

FLUSH = "l2 flush"  # the marks (and NVTX range) of a cold pass's L2 writes, left out of its time

# One pass: enqueues (or runs) its work, leaving in the dict any marks it wants kept, each a list of
# (begin, end) pairs of its timer's clock (per-layer events, the L2 flushes under FLUSH).
Pass = Callable[[dict], Any]


@dataclass(eq=False)
class Reading:
    """One timed pass: its timer's marks around it (`start`, `end`), the marks the pass left, and its
    milliseconds, read on first use: that waits for the device where the marks are events. Work
    the pass marked under FLUSH (a cold pass's L2 writes) is left out of its time, as jobs always did."""

    start: Any
    end: Any
    marks: dict
    elapsed: Callable[[Any, Any], float]  # (begin, end) -> ms, on this timer's clock
    wait: Callable[[], object] = lambda: None  # returns once `end` has happened

    def marked_ms(self, name: str) -> float:
        """The milliseconds of the pairs the pass marked under `name` (0 where none)."""
        return sum(self.elapsed(begin, end) for begin, end in self.marks.get(name, ()))

    @cached_property
    def ms(self) -> float:
        self.wait()
        return self.elapsed(self.start, self.end) - self.marked_ms(FLUSH)


class Timer(Protocol):
    """Times passes on one clock. `sync_each`: each pass is waited for before the next is enqueued;
    where it is False, a fixed number of passes are all enqueued before any is read (the device's
    queue never drains between them, as a kernel's back-to-back repeats want)."""

    @property
    def sync_each(self) -> bool: ...  # read only: a field, or a class's constant (HostClock)

    def warm(self, one_pass: Pass) -> None:
        """One untimed pass (a warm-up, or one of the energy window's)."""

    def time(self, one_pass: Pass) -> Reading:
        """One timed pass."""


def _host_ms(begin: float, end: float) -> float:
    return (end - begin) * 1e3


@dataclass
class HostClock:
    """A host clock around a synchronous call: honest only where the call returns when its work is
    done (the numpy CPU reference). A pass's marks are readings of the same clock (seconds)."""

    clock: Callable[[], float] = time.perf_counter
    sync_each: ClassVar[bool] = True

    def warm(self, one_pass: Pass) -> None:
        beat("pass")
        one_pass({})

    def time(self, one_pass: Pass) -> Reading:
        beat("pass")
        marks: dict = {}
        start = self.clock()
        one_pass(marks)
        return Reading(start, self.clock(), marks, _host_ms)


def _event_ms(begin, end) -> float:
    return end - begin  # CUDA events subtract to milliseconds


@dataclass
class CudaEvents:
    """Two events on `stream` (the `gpu`'s) around a pass's enqueue. With `span_from_pass`, the pass
    records its own first and last events on the stream and returns them (runner.pipeline_pass's
    start and end): no event of the timer's sits between the host's call and the pass's first copy.
    A warm-up with `sync_each` is a timed pass waited for and not read; without, the pass alone."""

    gpu: Any
    stream: Any
    sync_each: bool = True
    span_from_pass: bool = False

    def warm(self, one_pass: Pass) -> None:
        if self.sync_each:
            self.time(one_pass).wait()
        else:
            beat("pass")
            one_pass({})

    def time(self, one_pass: Pass) -> Reading:
        beat("pass")  # a pass that never ends is killed at its deadline (convsweep.measure.deadline)
        marks: dict = {}
        if self.span_from_pass:
            start, end = one_pass(marks)
        else:
            start = self.gpu.event(self.stream)
            one_pass(marks)
            end = self.gpu.event(self.stream)
        return Reading(start, end, marks, _event_ms, end.sync)


@dataclass
class GraphReplay(CudaEvents):
    """The first pass it is given captured once as a CUDA graph (gpu.capture on `stream`, its fork
    and join over other streams included), every pass after it one replay between two events on
    `stream`: one host call a pass. A pass whose buffers change (another round of inputs) is told
    apart by `key`: one graph is captured per key. A replay leaves no marks (events inside a graph
    cannot be read)."""

    key: Callable[[], Any] = lambda: None
    graphs: dict = field(default_factory=dict, init=False)

    def _replay(self, one_pass: Pass) -> Pass:
        key = self.key()
        if key not in self.graphs:
            # Uploaded before the timer's first event: a fresh round's first replay would otherwise
            # pay the upload, and the caching test would take the repeat's speed for a cache.
            self.graphs[key] = self.gpu.capture(self.stream, lambda: one_pass({}))
            self.graphs[key].upload(self.stream)
        graph = self.graphs[key]
        return lambda marks: graph.launch(self.stream)

    def warm(self, one_pass: Pass) -> None:
        super().warm(self._replay(one_pass))

    def time(self, one_pass: Pass) -> Reading:
        return super().time(self._replay(one_pass))


def pipeline_timer(gpu, stream, graph: bool, key: Callable[[], Any] = lambda: None) -> CudaEvents:
    """How a pipelined pass (runner.pipeline_pass, which returns its own first and last events) is
    timed, for jobs (`timer:`) and the bench's end-to-end row alike: between those events, or as one
    replay of it captured once per `key` (GraphReplay)."""
    return GraphReplay(gpu, stream, key=key) if graph else CudaEvents(gpu, stream, span_from_pass=True)


def _torch_ms(begin, end) -> float:
    return begin.elapsed_time(end)


@dataclass
class TorchEvents:
    """torch.cuda.Event pairs on a torch `stream`, the pass run with that stream current."""

    torch: Any
    stream: Any
    sync_each: bool = True

    def warm(self, one_pass: Pass) -> None:
        with self.torch.cuda.stream(self.stream):
            one_pass({})
        if self.sync_each:
            self.stream.synchronize()

    def time(self, one_pass: Pass) -> Reading:
        marks: dict = {}
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        with self.torch.cuda.stream(self.stream):
            start.record(self.stream)
            one_pass(marks)
            end.record(self.stream)
        return Reading(start, end, marks, _torch_ms, end.synchronize)


class Observer:
    """What happens around the timed passes, Kernel Tuner style; every hook does nothing unless a
    subclass says otherwise. Hooks run in the order of `sample`'s list."""

    def start(self, rule: StoppingRule) -> None:
        """After the warm-ups, before the first timed pass."""

    def before_pass(self, i: int) -> None:
        """Before timed pass `i` is enqueued."""

    def after_pass(self, i: int, reading: Reading) -> bool | None:
        """Once timed pass `i` is done (its reading waited for). False: the pass does not count (its inputs
        were not what a timed pass needs); the observers after this one do not see it, and it runs again."""

    def finish(self, timed_s: float, again: Callable[[], None]) -> None:
        """After the last timed pass, `timed_s` of the host clock after start; `again` runs one more
        untimed pass."""

    def results(self) -> dict:
        """What this observer adds to the measurement."""
        return {}


class HealthObserver(Observer):
    """What held the GPU's clocks down during the timed passes: the clocks before and after them, and
    NVML's slowdown bits after each pass and which passes they were seen after. `monitor`: a
    provenance.GpuMonitor (or a stand-in); None from it means NVML cannot tell."""

    def __init__(self, monitor):
        self.monitor, self.known, self.reasons, self.repeats, self.passes = monitor, False, 0, [], 0
        self.clocks = self.clocks_after = None

    def start(self, rule: StoppingRule) -> None:
        self.clocks = self.monitor.clocks()

    def after_pass(self, i: int, reading: Reading) -> None:
        self.passes += 1
        slowdowns = self.monitor.slowdowns()
        if slowdowns is None:
            return
        self.known = True
        if slowdowns:
            self.reasons |= slowdowns
            self.repeats.append(i)

    def finish(self, timed_s: float, again: Callable[[], None]) -> None:
        self.clocks_after = self.monitor.clocks()

    def results(self) -> dict:
        """`clocks`, `clocks_after`, `throttle` ({reasons, repeats} or None) and the `note`."""
        out = {"clocks": self.clocks, "clocks_after": self.clocks_after, "throttle": None, "note": None}
        if self.known:
            names = slowdown_names(self.reasons)
            out["throttle"] = {"reasons": names, "repeats": self.repeats}
            if self.repeats:
                out["note"] = (f"{len(self.repeats)} of {self.passes} timed passes ran with the clocks held down "
                               f"({', '.join(names)})")
        return out


@dataclass
class EnergyCounter:
    """NVML's energy counter (millijoules), read before the timed passes and after each. The driver
    advances it in steps tens of milliseconds apart, so readings a few passes apart differ by nothing
    or by a whole step: the GPU's mean power is taken between the first and the last step seen, and
    only when those lie at least MIN_SPAN_PASSES passes apart (a step is seen up to a pass late).
    Otherwise the power is not known, and None says so rather than a number off by a step."""

    MIN_SPAN_PASSES: ClassVar[int] = 10
    readings: list[tuple[float, int]] = field(default_factory=list)

    def read(self, millijoules: int | None, now: float) -> None:
        """A reading of the counter taken at `now` (seconds on the host clock); None: NVML has no counter."""
        if millijoules is not None:
            self.readings.append((now, millijoules))

    @classmethod
    def can_tell(cls, max_passes: int, window_s: float) -> bool:
        """Whether readings could give a power at all: the steps must lie MIN_SPAN_PASSES passes
        apart, so a setting of fewer timed passes, with no energy window after them, never has one."""
        return max_passes >= cls.MIN_SPAN_PASSES or window_s > 0

    @property
    def counting(self) -> bool:
        """Whether NVML has a counter to read at all."""
        return bool(self.readings)

    def watts(self, passes: int) -> float | None:
        """The mean power over the `passes` passes read so far, or None while the counter's steps
        span too few of them."""
        steps = [(now, after) for (_, before), (now, after) in zip(self.readings, self.readings[1:]) if after != before]
        if len(steps) < 2 or passes == 0:
            return None
        pass_s = (self.readings[-1][0] - self.readings[0][0]) / passes
        (t0, e0), (t1, e1) = steps[0], steps[-1]
        return (e1 - e0) / 1000 / (t1 - t0) if t1 - t0 >= self.MIN_SPAN_PASSES * pass_s else None

    def record(self, timed_s: float, passes: int, extra_passes: int = 0) -> dict | None:
        """The measurement's `energy`: the whole GPU's over the timed part, idle gaps between passes
        included, at the power measured over the timed passes and the `extra_passes` run after them."""
        watts = self.watts(passes + extra_passes)
        if watts is None:
            return None
        joules = watts * timed_s
        return {"joules": joules, "passes": passes, "joules_per_pass": joules / passes, "watts": watts,
                "extra_passes": extra_passes}


class EnergyObserver(Observer):
    """The GPU's energy over the timed passes from NVML's counter (`monitor.energy_mj`), read on
    `clock` before them and after each. NVML's energy query takes milliseconds: it is read only where
    a power can come of it (EnergyCounter.can_tell). A timed part shorter than the counter's steps can
    tell is followed by more passes of the same kind, untimed, until the counter has stepped enough:
    at most `window_s` of them; the power over those passes gives the energy of the timed ones."""

    def __init__(self, monitor, window_s: float, clock: Callable[[], float] = time.perf_counter):
        self.monitor, self.window_s, self.clock = monitor, window_s, clock
        self.energy: dict | None  # the counter's record once the passes are done
        self.counter, self.passes, self.energy = EnergyCounter(), 0, None
        self.extra_s: float | None = None  # seconds of the untimed passes after the timed part; None: none ran
        self.energy_mj: Callable[[], int | None] = lambda: None

    def start(self, rule: StoppingRule) -> None:
        if EnergyCounter.can_tell(rule.max_samples_taken, self.window_s):
            self.energy_mj = self.monitor.energy_mj
        self._read()

    def _read(self) -> None:
        self.counter.read(self.energy_mj(), self.clock())

    def after_pass(self, i: int, reading: Reading) -> None:
        self.passes += 1
        self._read()

    def finish(self, timed_s: float, again: Callable[[], None]) -> None:
        counter, t, extra = self.counter, self.clock(), 0
        while counter.counting and counter.watts(self.passes + extra) is None and self.clock() - t < self.window_s:
            again()
            self._read()
            extra += 1
        if extra:
            self.extra_s = self.clock() - t
        self.energy = counter.record(timed_s, self.passes, extra)

    def results(self) -> dict:
        return {"energy": self.energy}


class L2FlushObserver(Observer):
    """A cold cache: L2 written over (the `gpu`'s l2_flusher) before each conv layer of a pass.
    `before_layer` is the pass's hook: runner.pipeline_pass takes it as `flush` and marks each
    flush under FLUSH, so the pass's time leaves it out (Reading.ms) and this keeps it per pass."""

    def __init__(self, gpu):
        self._flush = gpu.l2_flusher()
        self.flush_ms: list[float] = []

    def before_layer(self, stream) -> None:
        self._flush(stream)

    def after_pass(self, i: int, reading: Reading) -> None:
        self.flush_ms.append(reading.marked_ms(FLUSH))

    def results(self) -> dict:
        """`l2_flush_ms`: each timed pass's flushes, in milliseconds."""
        return {"l2_flush_ms": self.flush_ms}


def gpu_observers(gpu, monitor, run, clock: Callable[[], float] = time.perf_counter) -> list[Observer]:
    """What watches a job's timed passes on the GPU (runner.Backend's default): the clocks and NVML's
    slowdowns, the energy counter (with `run.energy_window_s` of untimed passes where needed), and
    for `run.cache` cold, the L2 flush before each conv layer. A test's Backend hands in its own."""
    observers: list[Observer] = [HealthObserver(monitor), EnergyObserver(monitor, run.energy_window_s, clock)]
    if run.cache == "cold":
        observers.append(L2FlushObserver(gpu))
    return observers


@dataclass
class Sampled:
    """What `sample` measured: each timed pass's milliseconds and reading, why it stopped, the host
    seconds of the warm-ups and of the timed part (observers' hooks included, `finish` not), and what
    the observers added."""

    samples_ms: list[float]
    readings: list[Reading]
    stop: str
    stopping: dict  # the rule's record of it (StoppingRule.record): a measurement's `stopping`
    warmup_s: float
    timed_s: float
    observed: dict


def sample(timer: Timer, one_pass: Pass, rule: StoppingRule, observers: Sequence[Observer] = (), warmup: int = 0,
           clock: Callable[[], float] = time.perf_counter,
           label: Callable[[str], AbstractContextManager] = lambda name: nullcontext()) -> Sampled:
    """`warmup` untimed passes, then timed ones until `rule` (a fresh one: it keeps the samples) says
    stop; `clock` is what the rule's elapsed time is read on. Each pass is enqueued inside
    `label("warmup <w>")`, `label("repeat <i>")` or, for finish's, `label("untimed <k>")`: NVTX ranges
    (runner.nvtx_range) by which nsys.py tells the timed passes' GPU work. A timer without `sync_each`
    under a fixed rule has every pass enqueued before the first is read, and its observers see
    `after_pass` only then; under an auto rule each pass is read as it ends: the rule needs its time. A pass
    an observer refuses (after_pass returns False) is not counted, and another is timed in its place: the
    NVTX labels count every pass timed, and the stopping record's `discarded` names those that did not count."""
    t = clock()
    for w in range(warmup):
        with label(f"warmup {w}"):
            timer.warm(one_pass)
    warmup_s = clock() - t
    for o in observers:
        o.start(rule)

    attempts = itertools.count()  # each timed pass's NVTX label: `discarded` names those that did not count

    def enqueue(i: int) -> Reading:
        for o in observers:
            o.before_pass(i)
        with label(f"repeat {next(attempts)}"):
            return timer.time(one_pass)

    t = clock()
    ahead = [enqueue(i) for i in range(rule.repeats)] if not timer.sync_each and rule.repeats is not None else []
    readings: list[Reading] = []
    discarded: list[int] = []
    stop = None
    while stop is None:
        i = len(readings)
        reading = ahead.pop(0) if ahead else enqueue(i)
        ms = reading.ms
        if any(o.after_pass(i, reading) is False for o in observers):
            discarded.append(i + len(discarded))  # not counted (any() stops at the observer that said so)
            continue
        readings.append(reading)
        stop = rule.reason(ms, clock() - t)
    timed_s = clock() - t
    untimed = itertools.count()

    def again() -> None:
        with label(f"untimed {next(untimed)}"):
            timer.warm(one_pass)

    for o in observers:
        o.finish(timed_s, again)
    observed = {key: value for o in observers for key, value in o.results().items()}
    stopping = {**rule.record(stop), **({"discarded": discarded} if discarded else {})}
    return Sampled([r.ms for r in readings], readings, stop, stopping, warmup_s, timed_s, observed)
