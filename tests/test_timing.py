"""The timers, observers and sampling loop of convsweep.measure.timing with stand-ins: a GPU whose events read a
scripted clock, NVML monitors that answer from a script, PyTorch's events as fakes, a steady host clock."""
import contextlib
import itertools

import numpy as np
import pytest

from convsweep.model.network import load_network, load_weights
from convsweep.base.paths import ROOT
from convsweep.measure.runner import ConvPlan, pipeline_buffers, pipeline_pass
from convsweep.measure.timing import FLUSH
from convsweep.base.stats import StoppingRule
from convsweep.measure.timing import (CudaEvents, EnergyCounter, EnergyObserver, GraphReplay, HealthObserver, HostClock,
                              L2FlushObserver, Observer, TorchEvents, sample)
from convsweep.model.variants import get_variant

from fake_gpu import FakeGpuNetwork, ScriptedGpu, SlowingMonitor, SteadyClock, SteppingEveryEighthRead


class Watcher(Observer):
    """Logs every hook into `log` (the scripted GPU's, so hooks and device work show in one order)."""

    def __init__(self, log):
        self.log = log

    def start(self, rule):
        self.log.append(("start",))

    def before_pass(self, i):
        self.log.append(("before", i))

    def after_pass(self, i, reading):
        self.log.append(("after", i, reading.ms))

    def finish(self, timed_s, again):
        self.log.append(("finish",))

    def results(self):
        return {"watched": True}


def logged_pass(log, name="pass"):
    return lambda marks: log.append((name,))


# -- the sampling loop ---------------------------------------------------------------------------
def test_a_fixed_rule_enqueues_every_pass_before_it_reads_one():
    """The bench's kernels: warm-ups are the pass alone, then every timed pass between its two events
    with no wait, and only then the reads (the device's queue never drains between passes)."""
    gpu = ScriptedGpu([0, 1, 10, 13, 20, 22])
    log = gpu.log
    sampled = sample(CudaEvents(gpu, None, sync_each=False), logged_pass(log), StoppingRule(repeats=3),
                     [Watcher(log)], warmup=2)
    assert sampled.samples_ms == [1, 3, 2] and sampled.stop == "fixed" and sampled.observed == {"watched": True}
    assert log == [("pass",), ("pass",), ("start",),
                   ("before", 0), ("event", 0), ("pass",), ("event", 1),
                   ("before", 1), ("event", 10), ("pass",), ("event", 13),
                   ("before", 2), ("event", 20), ("pass",), ("event", 22),
                   ("sync", 1), ("after", 0, 1), ("sync", 13), ("after", 1, 3), ("sync", 22), ("after", 2, 2),
                   ("finish",)]


def test_a_pass_waited_for_each_time_is_read_before_the_next_and_so_are_its_warm_ups():
    gpu = ScriptedGpu(itertools.count())
    log = gpu.log
    sampled = sample(CudaEvents(gpu, None), logged_pass(log), StoppingRule(repeats=2), [Watcher(log)], warmup=1)
    assert sampled.samples_ms == [1, 1]
    assert log == [("event", 0), ("pass",), ("event", 1), ("sync", 1), ("start",),
                   ("before", 0), ("event", 2), ("pass",), ("event", 3), ("sync", 3), ("after", 0, 1),
                   ("before", 1), ("event", 4), ("pass",), ("event", 5), ("sync", 5), ("after", 1, 1), ("finish",)]


def host_passes(durations_s):
    """A host clock and a pass that takes the next of `durations_s` on it."""
    clock, steps = SteadyClock(0.0), iter(durations_s)

    def one_pass(marks):
        clock.now += next(steps)

    return HostClock(clock), one_pass


@pytest.mark.parametrize("durations_ms, rule, stop, samples", [
    ([5, 1, 1, 1, 1], StoppingRule(min_samples=3, min_time_s=0.0), "converged", 3),  # [5, 1, 1]: no spread
    ([1, 2] * 50, StoppingRule(max_samples=7), "max_samples", 7),
    ([4] * 3, StoppingRule(repeats=3), "fixed", 3),
])
def test_an_auto_rule_stops_as_the_rule_says(durations_ms, rule, stop, samples):
    timer, one_pass = host_passes([ms / 1e3 for ms in durations_ms])
    sampled = sample(timer, one_pass, rule, clock=SteadyClock(0.0))
    assert sampled.stop == stop and sampled.samples_ms == pytest.approx(durations_ms[:samples])
    assert rule.record(stop)["samples"] == samples


def test_a_timeout_is_read_on_the_clock_handed_in():
    """Each read of the loop's clock advances it 1 s: the rule sees 1, 2, 3 s after the passes."""
    timer, one_pass = host_passes([0.001] * 50)
    sampled = sample(timer, one_pass, StoppingRule(timeout_s=2.5), clock=SteadyClock(1.0))
    assert (sampled.stop, len(sampled.samples_ms), sampled.timed_s) == ("timeout", 3, 4.0)


def test_an_auto_rule_reads_each_pass_before_the_next_even_where_the_timer_need_not_wait():
    gpu = ScriptedGpu(itertools.count())
    sampled = sample(CudaEvents(gpu, None, sync_each=False), lambda marks: None,
                     StoppingRule(min_samples=2, min_time_s=0.0), clock=SteadyClock(0.0))
    assert sampled.stop == "converged"
    assert gpu.log == [("event", 0), ("event", 1), ("sync", 1), ("event", 2), ("event", 3), ("sync", 3)]


def test_observers_see_every_timed_pass_and_never_a_warm_up_and_finish_may_run_more():
    passes = []

    class Again(Observer):
        def __init__(self):
            self.seen, self.started, self.timed_s = [], 0, None

        def start(self, rule):
            self.started += 1
            self.at_start = len(passes)

        def before_pass(self, i):
            self.seen.append(("before", i, len(passes)))

        def after_pass(self, i, reading):
            self.seen.append(("after", i, len(passes)))

        def finish(self, timed_s, again):
            self.timed_s = timed_s
            again()
            again()

    timer, one_pass = host_passes([0.002] * 20)
    observer = Again()
    sampled = sample(timer, lambda marks: (passes.append(1), one_pass(marks)), StoppingRule(repeats=4), [observer],
                     warmup=3, clock=SteadyClock(0.5))
    assert observer.started == 1 and observer.at_start == 3  # after the three warm-ups
    assert observer.seen == [(kind, i, 3 + i + (kind == "after")) for i in range(4) for kind in ("before", "after")]
    assert len(passes) == 3 + 4 + 2 and len(sampled.samples_ms) == 4  # finish's passes are untimed
    assert observer.timed_s == sampled.timed_s == pytest.approx(4 * 0.5 + 0.5) and sampled.warmup_s == 0.5


def test_each_pass_is_enqueued_inside_a_range_named_for_what_it_is():
    """nsys.py attributes GPU work to timed passes by their "repeat <i>" ranges; warm-ups and the
    passes observers run after the timed part are outside any."""
    gpu = ScriptedGpu(itertools.count())
    log = gpu.log

    @contextlib.contextmanager
    def label(name):
        log.append(("push", name))
        yield
        log.append(("pop",))

    class OneMore(Observer):
        def finish(self, timed_s, again):
            again()

    sample(CudaEvents(gpu, None), logged_pass(log), StoppingRule(repeats=1), [OneMore()], warmup=1, label=label)
    assert log == [("push", "warmup 0"), ("event", 0), ("pass",), ("event", 1), ("sync", 1), ("pop",),
                   ("push", "repeat 0"), ("event", 2), ("pass",), ("event", 3), ("pop",), ("sync", 3),
                   ("push", "untimed 0"), ("event", 4), ("pass",), ("event", 5), ("sync", 5), ("pop",)]


# -- timers --------------------------------------------------------------------------------------
def test_a_pass_an_observer_refuses_is_timed_again_under_a_label_of_its_own():
    class RefusesTheSecond(Observer):
        def __init__(self):
            self.seen = []

        def after_pass(self, i, reading):
            self.seen.append(i)
            return len(self.seen) != 2

    log, labels = [], []
    after, refuses = Watcher(log), RefusesTheSecond()
    sampled = sample(HostClock(), lambda marks: None, StoppingRule(repeats=3), [refuses, after],
                     label=lambda name: labels.append(name) or contextlib.nullcontext())
    assert refuses.seen == [0, 1, 1, 2] and len(sampled.samples_ms) == 3
    assert labels == ["repeat 0", "repeat 1", "repeat 2", "repeat 3"] and sampled.stopping["discarded"] == [1]
    assert [e[:2] for e in log if e[0] == "after"] == [("after", 0), ("after", 1), ("after", 2)]


def test_a_pass_that_brings_its_own_events_is_timed_between_them():
    """runner.pipeline_pass's start and end: no event of the timer's around them."""
    gpu = ScriptedGpu(itertools.count())
    sampled = sample(CudaEvents(gpu, None, span_from_pass=True),
                     lambda marks: (gpu.event(None), gpu.event(None), gpu.event(None))[::2], StoppingRule(repeats=2))
    assert sampled.samples_ms == [2, 2]
    assert gpu.log == [("event", 0), ("event", 1), ("event", 2), ("sync", 2),
                       ("event", 3), ("event", 4), ("event", 5), ("sync", 5)]


def test_graph_replay_captures_the_pass_once_and_times_each_replay():
    gpu = ScriptedGpu(itertools.count(0, 2))
    log = gpu.log
    sampled = sample(GraphReplay(gpu, None), logged_pass(log), StoppingRule(repeats=3), warmup=2)
    assert len(gpu.graphs) == 1 and gpu.graphs[0].launches == 5
    assert sampled.samples_ms == [2, 2, 2] and all(r.marks == {} for r in sampled.readings)
    # capturing runs nothing; every launch runs the pass once, between its two events, then waits
    # uploaded before the first event: a first replay that paid for it would look slower than a repeat
    assert log[:6] == [("capture",), ("upload",), ("event", 0), ("pass",), ("event", 2), ("sync", 2)]
    assert gpu.graphs[0].uploads == 1
    assert log.count(("pass",)) == 5 and log.count(("capture",)) == 1


class FakeTorch:
    """torch.cuda as TorchEvents uses it: timing events that read a script, a stream context, a stream."""

    def __init__(self, times):
        self.times, self.log = iter(times), []
        self.cuda = self

    def Event(self, enable_timing):
        assert enable_timing
        return FakeTorchEvent(self)

    @contextlib.contextmanager
    def stream(self, stream):
        self.log.append(("in", stream))
        yield
        self.log.append(("out", stream))


class FakeTorchEvent:
    def __init__(self, torch):
        self.torch = torch

    def record(self, stream):
        self.t = next(self.torch.times)
        self.torch.log.append(("record", stream, self.t))

    def elapsed_time(self, end):
        return end.t - self.t

    def synchronize(self):
        self.torch.log.append(("synchronize", self.t))


class FakeTorchStream:
    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append(("stream synchronize",))


def test_torch_events_time_each_pass_on_the_stream_made_current():
    torch = FakeTorch([0, 4, 5, 7])
    log = torch.log
    sampled = sample(TorchEvents(torch, "s", sync_each=False), logged_pass(log, "fn"), StoppingRule(repeats=2),
                     warmup=1)
    assert sampled.samples_ms == [4, 2]
    assert log == [("in", "s"), ("fn",), ("out", "s"),
                   ("in", "s"), ("record", "s", 0), ("fn",), ("record", "s", 4), ("out", "s"),
                   ("in", "s"), ("record", "s", 5), ("fn",), ("record", "s", 7), ("out", "s"),
                   ("synchronize", 4), ("synchronize", 7)]
    stream = FakeTorchStream(log)
    TorchEvents(FakeTorch([]), stream).warm(lambda marks: None)
    assert log[-1] == ("stream synchronize",)  # waited for, where each pass is


# -- observers -----------------------------------------------------------------------------------
LENET = load_network(ROOT / "networks/lenet86.yaml")


def test_a_cold_pass_flushes_l2_before_each_conv_layer_and_leaves_the_flushes_out_of_its_time():
    """A job's pass over a fake network: every event ticks 0.25 ms, so a pass is start, h2d end,
    2 x (flush pair, layer pair), d2h start, end: 2.75 ms, of which the two flushes are 0.5."""
    gpu = ScriptedGpu(itertools.count(0, 0.25))
    stream = gpu.stream()
    plan = ConvPlan({n: get_variant("naive") for n in ("conv1", "conv2")}, {"conv1": {}, "conv2": {}})
    net = FakeGpuNetwork(gpu, LENET, load_weights(LENET), plan, 1, 2)
    images = np.zeros((2, *LENET.layers[0].in_shape), np.float32)
    buffers = pipeline_buffers(gpu, LENET, images, "pageable", stream)
    cold = L2FlushObserver(gpu)

    def one_pass(marks):
        start, _, _, end = pipeline_pass(gpu, net, [stream], [(0, 2)], buffers, marks, cold.before_layer)
        return start, end

    sampled = sample(CudaEvents(gpu, stream, span_from_pass=True), one_pass, StoppingRule(repeats=3), [cold], warmup=1)
    assert gpu.log.count(("flush",)) == 2 * (1 + 3)  # two conv layers, warm-up and timed passes alike
    assert sampled.samples_ms == [pytest.approx(2.75 - 0.5)] * 3
    assert sampled.observed == {"l2_flush_ms": [pytest.approx(0.5)] * 3}
    assert all(r.marked_ms("conv1") == r.marked_ms("conv2") == 0.25 for r in sampled.readings)
    assert all(len(r.marks[FLUSH]) == 2 for r in sampled.readings)


class NoNvml:
    def clocks(self):
        return {"sm_mhz": None, "memory_mhz": None}

    def slowdowns(self):
        return None

    def energy_mj(self):
        return None


def timed_on_events(observers, repeats, clock):
    """`repeats` passes on a scripted GPU: events read no host clock, so `clock` is read only by the
    loop and the observers."""
    gpu = ScriptedGpu(itertools.count())
    return sample(CudaEvents(gpu, None), lambda marks: None, StoppingRule(repeats=repeats), observers, warmup=1,
                  clock=clock)


def test_health_and_energy_observers_make_a_settings_records():
    monitor, clock = SlowingMonitor(), SteadyClock(0.001)
    health, energy = HealthObserver(monitor), EnergyObserver(monitor, 0.0, clock)
    sampled = timed_on_events([health, energy], 20, clock)
    observed = sampled.observed
    assert observed["clocks"] == {"sm_mhz": 1980, "memory_mhz": 2619}
    assert observed["clocks_after"] == {"sm_mhz": 1755, "memory_mhz": 2619}
    assert observed["throttle"] == {"reasons": ["sw_power_cap"], "repeats": [1, 3]}
    assert observed["note"] == "2 of 20 timed passes ran with the clocks held down (sw_power_cap)"
    # 2.5 J a reading, two clock reads a pass (the energy's, the rule's): 1250 W; 20 passes and the end, 41 ms
    assert observed["energy"] == pytest.approx({"joules": 1250 * 0.041, "passes": 20, "joules_per_pass": 1250 * 0.041 / 20,
                                                "watts": 1250, "extra_passes": 0})
    assert sampled.timed_s == pytest.approx(0.041) and energy.extra_s is None


def test_without_nvml_nothing_is_guessed():
    clock = SteadyClock(0.001)
    observed = timed_on_events([HealthObserver(NoNvml()), EnergyObserver(NoNvml(), 0.5, clock)], 3, clock).observed
    assert observed == {"clocks": {"sm_mhz": None, "memory_mhz": None}, "clocks_after": {"sm_mhz": None, "memory_mhz": None},
                        "throttle": None, "note": None, "energy": None}


@pytest.mark.parametrize("window_s", [0.5, 0.0])
def test_a_timed_part_too_short_for_the_counter_is_followed_by_untimed_passes(window_s):
    monitor, clock = SteppingEveryEighthRead(), SteadyClock(0.001)
    energy = EnergyObserver(monitor, window_s, clock)
    sampled = timed_on_events([energy], 3, clock)
    assert len(sampled.samples_ms) == 3  # the untimed passes are no samples
    if window_s == 0:  # three passes, no window: the counter is not even read
        assert sampled.observed == {"energy": None} and energy.extra_s is None and monitor.energy_reads == 0
        return
    record = sampled.observed["energy"]
    # Readings 1-4 bracket the timed passes; the counter steps at the 8th, 16th and 24th. The 8th and
    # 16th lie 8 passes apart, fewer than MIN_SPAN_PASSES: the power is known at the 24th, 20 passes on.
    assert record["passes"] == 3 and record["extra_passes"] == 20
    assert energy.extra_s == pytest.approx(20 * 0.002 + 0.001)  # two clock reads a pass, one to end
    assert record["watts"] == pytest.approx(2 * 20.0 / (16 * 2 * 0.001))  # 40 J over 16 passes of 2 ms
    assert record["joules_per_pass"] == pytest.approx(record["watts"] * sampled.timed_s / 3)


def test_the_energy_window_bounds_the_untimed_passes():
    """A window that ends before the counter has stepped far enough: the passes stop, the power stays unknown."""
    clock = SteadyClock(0.001)
    energy = EnergyObserver(SteppingEveryEighthRead(), 0.0105, clock)
    assert timed_on_events([energy], 3, clock).observed == {"energy": None}
    # Five passes (two reads each) began inside the 10.5 ms; the check that ended it and the phase's read add 2 ms.
    assert energy.extra_s == pytest.approx(0.012)


def test_energy_is_the_power_between_the_counters_steps_or_not_known():
    def counter(step_s, pass_s, passes, watts=150.0):
        """Passes of pass_s; the driver adds watts x step_s to the counter every step_s."""
        c = EnergyCounter()
        for i in range(passes + 1):
            now = 0.001 + i * pass_s
            c.read(round(1e6 + int(now / step_s) * watts * step_s * 1000), now)
        return c.record(passes * pass_s, passes)

    # 100 ms steps, 2 ms passes, 200 passes: 0.4 s timed, four steps seen
    energy = counter(0.1, 0.002, 200)
    assert energy["watts"] == pytest.approx(150.0, rel=0.03)
    assert energy["joules_per_pass"] == pytest.approx(150.0 * 0.002, rel=0.03)
    # five passes of 2 ms: the counter stepped at most once, and nothing is guessed
    assert counter(0.1, 0.002, 5) is None
    # five passes of 40 ms: two steps 2-3 passes apart, too few to tell the power within a step
    assert counter(0.1, 0.04, 5) is None
    assert EnergyCounter().record(1.0, 10) is None  # no counter


def test_the_energy_counter_is_read_per_pass_only_where_a_power_can_come_of_it():
    """Fewer timed passes than the counter's span, and no energy window: no reading can give a
    power (so a job does not spend NVML's milliseconds a pass on it); more passes, or a window, can."""
    few = EnergyCounter.MIN_SPAN_PASSES - 1
    assert not EnergyCounter.can_tell(few, 0)
    assert EnergyCounter.can_tell(few, 0.5) and EnergyCounter.can_tell(EnergyCounter.MIN_SPAN_PASSES, 0)
    c = EnergyCounter()  # whatever the readings of so few passes, watts stays unknown
    for i in range(few + 1):
        c.read(1_000_000 + 5_000 * i, 0.001 + 0.05 * i)  # a step after every pass
    assert c.watts(few) is None
    for repeats, reads in ((few, 0), (EnergyCounter.MIN_SPAN_PASSES, EnergyCounter.MIN_SPAN_PASSES + 1)):
        monitor, clock = SlowingMonitor(), SteadyClock(0.001)
        timed_on_events([EnergyObserver(monitor, 0.0, clock)], repeats, clock)
        assert monitor.energy_reads == reads
