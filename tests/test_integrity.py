"""The integrity checks without a GPU: each detector of convsweep.measure.integrity against a numpy network
that cheats the way a red-team kernel does (tests/redteam/ has the real ones, caught on the device),
through the backend seam: the rounds, the float64 truth and the comparisons run kernels/truth.cu built
for the host (tests/host_kernels.py). Then the verdicts and floors on their own."""
import numpy as np
import pytest

from convsweep.measure import integrity
from convsweep.sweep.config import RunSpec
from convsweep.measure.settings import measure
from convsweep.model.network import load_network, reference_forward
from convsweep.device.peaks import Peaks
from convsweep.measure.record import Integrity, Measurement, Timings

from fake_gpu import FAKE, FakeClock, FakeGpu, FakeGpuNetwork

LENET = load_network("networks/lenet86.yaml")


def run(**over) -> RunSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}},
                batch=24, streams=1, host_memory="pageable", repeats=4, warmup=1, profiler="events")
    base.update(over)
    return RunSpec(**base)


def measured(network_class, gpu_class=FakeGpu, **over) -> Measurement:
    backend = type(FAKE)(gpu=gpu_class, conv_op=FAKE.conv_op, network=network_class, compile_all=FAKE.compile_all,
                         devices=FAKE.devices, peaks=FAKE.peaks)
    return measure(run(**over), backend=backend)


# -- networks that cheat ------------------------------------------------------------------------
class ComputesOnce(FakeGpuNetwork):
    """Right on its first pass (the seed), then returns at once: its outputs keep what they held."""

    passes = 0

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        self.passes += 1
        if self.passes == 1:
            super().enqueue(stream, lane, x, logits, n, events, flush)


class MemoByPointer(FakeGpuNetwork):
    """Keeps its output by the input's address and hands it back whenever that address comes again."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        kept = getattr(self, "kept", {})
        self.kept = kept
        if x.ptr in kept:
            self.gpu.read(logits.rows(0, n))[...] = kept[x.ptr]
            return
        super().enqueue(stream, lane, x, logits, n, events, flush)
        kept[x.ptr] = self.gpu.read(logits.rows(0, n)).copy()


class MemoByValue(FakeGpuNetwork):
    """Keeps its output by the input's bytes: right always, and fast on values it has seen (its layers'
    events 0.25 ms apart on a hit, 4.25 on a miss)."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        kept = getattr(self, "kept", {})
        self.kept = kept
        key = self.gpu.read(x.rows(0, n)).tobytes()
        hit = key in kept
        for layer in self.timed:
            if events is not None:
                begin = self.gpu.event(stream)
                FakeClock.now += 0.0 if hit else 4.0
                events.setdefault(layer.name, []).append((begin, self.gpu.event(stream)))
        if hit:
            self.gpu.read(logits.rows(0, n))[...] = kept[key]
            return
        self.gpu.read(logits.rows(0, n))[...] = reference_forward(self.network, self.weights,
                                                                   self.gpu.read(x.rows(0, n)), dtype=np.float32)
        kept[key] = self.gpu.read(logits.rows(0, n)).copy()


class MemoFromThirdSighting(FakeGpuNetwork):
    """Counts the sightings of each input's bytes and serves the kept output from the third one on: the
    caching test's old pairs (N1 N1 N2 N2) never showed it."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        seen = self.__dict__.setdefault("seen", {})
        key = self.gpu.read(x.rows(0, n)).tobytes()
        count, kept = seen.get(key, (0, None))
        hit = count >= 2
        for layer in self.timed:
            if events is not None:
                begin = self.gpu.event(stream)
                FakeClock.now += 0.0 if hit else 4.0
                events.setdefault(layer.name, []).append((begin, self.gpu.event(stream)))
        if hit:
            self.gpu.read(logits.rows(0, n))[...] = kept
        else:
            super().enqueue(stream, lane, x, logits, n)
        seen[key] = (count + 1, self.gpu.read(logits.rows(0, n)).copy())


class MemoOnPartOfTheInput(FakeGpuNetwork):
    """Keys its memo on each image's four corners (blank in every digit, every round), so on a fresh round it
    serves an answer kept for other images."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        kept = self.__dict__.setdefault("kept", {})
        key = self.gpu.read(x.rows(0, n))[..., ::85, ::85].tobytes()
        if key in kept:
            self.gpu.read(logits.rows(0, n))[...] = kept[key]
            return
        super().enqueue(stream, lane, x, logits, n, events, flush)
        kept[key] = self.gpu.read(logits.rows(0, n)).copy()


class KnowsRoundZero(FakeGpuNetwork):
    """Recognises the seeds' public batch (its first image's bytes) and then skips the work (0 ms a layer),
    serving the logits it kept from the first pass over it."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        first = self.gpu.read(x.rows(0, 1)).tobytes()
        known = self.__dict__.setdefault("known", {})
        hit = first in known
        for layer in self.timed:
            if events is not None:
                begin = self.gpu.event(stream)
                FakeClock.now += 0.0 if hit else 4.0
                events.setdefault(layer.name, []).append((begin, self.gpu.event(stream)))
        if hit:
            self.gpu.read(logits.rows(0, n))[...] = known[first]
            return
        super().enqueue(stream, lane, x, logits, n)
        if not known:
            known[first] = self.gpu.read(logits.rows(0, n)).copy()


class MemoInItsWorkspace(FakeGpuNetwork):
    """Keeps a tag and its last output in a workspace of its lane (a variant's scratch, which outlives a pass), and
    serves the output when the input's tag matches: fast on any repeat. The harness poisons every workspace
    before a timed pass: the tag no longer matches."""

    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        from convsweep.measure.runner import Lane

        out = network.layers[-1].out_shape
        self.lanes = [Lane(capacity, workspaces={"conv1": gpu.alloc((8 + capacity * out[0],), np.float64)})
                      for _ in range(lanes)]

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        workspace = self.gpu.read(lane.workspaces["conv1"])
        tag = float(np.sum(self.gpu.read(x.rows(0, n)), dtype=np.float64))
        hit = workspace[0] == tag
        for layer in self.timed:
            if events is not None:
                begin = self.gpu.event(stream)
                FakeClock.now += 0.0 if hit else 4.0
                events.setdefault(layer.name, []).append((begin, self.gpu.event(stream)))
        out = self.gpu.read(logits.rows(0, n))
        if hit:
            out[...] = workspace[8 : 8 + out.size].reshape(out.shape)
            return
        super().enqueue(stream, lane, x, logits, n)
        workspace[0], workspace[8 : 8 + out.size] = tag, out.reshape(-1)


class QuickerAfterTheTruth(FakeGpuNetwork):
    """Honest, and quicker right after the harness's float64 truth of a whole batch (3 ms a layer against 4): the
    GPU's clocks after seconds at full load, as the lent H100 showed (`truth_runs` counts those truths)."""

    truth_runs = 0

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        quick = self.__dict__.get("seen_truths") != QuickerAfterTheTruth.truth_runs
        self.seen_truths = QuickerAfterTheTruth.truth_runs
        for layer in self.timed:
            if events is not None:
                begin = self.gpu.event(stream)
                FakeClock.now += 3.0 if quick else 4.0
                events.setdefault(layer.name, []).append((begin, self.gpu.event(stream)))
        super().enqueue(stream, lane, x, logits, n)


class ReadsItsWorkspaceFirst(FakeGpuNetwork):
    """Adds what its workspace holds (zero when a pass left it so) to the logits: right only where the workspace is
    what the kernel expects, not after the harness poisoned it."""

    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        from convsweep.measure.runner import Lane

        self.lanes = [Lane(capacity, workspaces={"conv1": gpu.alloc((1,), np.float32)}) for _ in range(lanes)]

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        super().enqueue(stream, lane, x, logits, n, events, flush)
        scratch = self.gpu.read(lane.workspaces["conv1"])
        self.gpu.read(logits.rows(0, n))[...] += scratch[0]
        scratch[0] = 0.0


class WritesPart(FakeGpuNetwork):
    """Right, but the last image's logits are never written."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        super().enqueue(stream, lane, x, logits.rows(0, n - 1), n - 1, events, flush)


class OffOnAFew(FakeGpuNetwork):
    """Right but for every seventh image, whose logits are off by 3e-5 of their scale."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        super().enqueue(stream, lane, x, logits, n, events, flush)
        out = self.gpu.read(logits.rows(0, n))
        out[::7] += 3e-5 * np.abs(out).max()


class BusyAfter(FakeGpu):
    """A GPU that still works for 2 ms after every pass: a stream the timer does not wait for."""

    idle_ms = 2.0


class SetsWindow(FakeGpuNetwork):
    """A library that sets a persisting-L2 window on every pass."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        self.gpu.persisting_l2_bytes, self.gpu.windows = 1 << 20, (0,)
        super().enqueue(stream, lane, x, logits, n, events, flush)


class SetWindowOnce(FakeGpuNetwork):
    """A library that set a persisting-L2 window when it was made, before any timing."""

    def __init__(self, gpu, *args):
        super().__init__(gpu, *args)
        gpu.persisting_l2_bytes, gpu.windows = 1 << 20, (0,)


# -- what each is found out by ------------------------------------------------------------------
def test_an_honest_network_is_ok_every_timed_pass_checked_on_fresh_inputs():
    m = measured(FakeGpuNetwork)
    assert m.status == "ok", m.error
    found = m.integrity
    assert found.checks == "full" and found.checked_passes == 4 and found.failed_pass is None
    assert found.fresh_passes == 4 and len(set(found.rounds)) == 4 and 0 not in found.rounds
    assert len(found.inputs["seed"]) == 16 and found.inputs["perturbation"]["max_shift"] == 3
    assert found.freshness["share"] >= 0.99 and found.freshness["stale_rounds"] == 0
    assert found.caching["sightings"] == integrity.SIGHTINGS
    assert integrity.CACHING_ROUNDS <= found.caching["rounds"] == len(found.caching["times_ms"][0]) \
        <= integrity.CACHING_ROUNDS_MAX
    assert found.device_state["reset"] is False and not found.reasons
    assert 0.99 <= found.caching["ratio"] <= 1.01  # the same work, fresh or repeated
    assert 0.8 <= found.fresh_accuracy <= 1.0 and found.fresh_accuracy == pytest.approx(found.fresh_truth_accuracy,
                                                                                          abs=0.05)


def test_every_run_draws_its_own_seed():
    seeds = {measured(FakeGpuNetwork, checks="fast").integrity.inputs["seed"] for _ in range(2)}
    assert len(seeds) == 2


def test_a_kernel_that_computes_once_fails_at_the_first_timed_pass():
    m = measured(ComputesOnce)
    assert m.status == "incorrect" and m.integrity.failed_pass == 0
    assert m.error.startswith("timed pass 0: output holds NaN")
    assert m.accuracy is not None  # the seed pass was right: its accuracy is the run's


def test_memoizing_by_address_is_wrong_on_the_first_fresh_round():
    m = measured(MemoByPointer)
    assert m.status == "incorrect" and m.integrity.failed_pass == 0 and m.error.startswith("timed pass 0: ")


def test_memoizing_by_value_is_right_but_the_caching_test_finds_it_out():
    m = measured(MemoByValue)
    assert m.status == "suspect" and "caching test: sighting 2" in m.error
    assert m.timings.op_time_ms["conv1"] == pytest.approx(4.25)  # the timed passes: fresh, so every one a miss
    caching = m.integrity.caching
    assert caching["ratio"] < 1 - caching["threshold"]


def test_a_memo_that_serves_from_the_third_sighting_is_found_out():
    m = measured(MemoFromThirdSighting)
    assert m.status == "suspect" and "caching test: sighting 3" in m.error, m.error
    assert m.timings.op_time_ms["conv1"] == pytest.approx(4.25)


class MemoInSomeRounds(MemoByValue):
    """A memo that keeps every other input it has not seen before: fast on a repeat of some rounds, not all, so the
    caching test, which asks every round to show it, does not call it suspect."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        key = self.gpu.read(x.rows(0, n)).tobytes()
        order = self.__dict__.setdefault("order", {})
        order.setdefault(key, len(order))
        if order[key] % 2:
            self.__dict__.setdefault("kept", {}).pop(key, None)  # never kept: computed every time
        super().enqueue(stream, lane, x, logits, n, events, flush)


def test_a_memo_that_skips_some_rounds_slips_the_caching_test_and_gains_nothing():
    """The limit of a caching test that asks every round (with more rounds for short passes): a memo that serves
    only some rounds is `ok`, and its timed passes, every one on a fresh round, are its own work."""
    m = measured(MemoInSomeRounds)
    assert m.status == "ok", m.error
    assert min(min(ratios) for ratios in m.integrity.caching["ratios"]) < 0.5  # it served some rounds' repeats
    assert m.timings.op_time_ms["conv1"] == pytest.approx(4.25) and m.integrity.fresh_passes == 4


def test_with_fast_checks_every_timed_pass_is_still_fresh_and_checked_only_the_caching_test_goes():
    for memo in (MemoByValue, MemoFromThirdSighting, MemoInItsWorkspace):
        m = measured(memo, checks="fast")
        assert m.status == "ok" and m.spec["checks"] == "fast", m.error
        assert m.integrity.checks == "fast" and m.integrity.fresh_passes == 4 and m.integrity.caching is None
        assert m.integrity.checked_passes == 4
        assert m.timings.op_time_ms["conv1"] == pytest.approx(4.25), memo  # no pass of it hit: honest times


def test_every_sighting_of_the_caching_test_follows_the_same_device_work(monkeypatch):
    """An honest kernel that runs quicker after the truth of a whole batch: each sighting follows one, so no later
    sighting is quicker than the first (with the truth only in the first's check, every second one took 0.76x)."""
    from convsweep.device.truth import Truth

    forward = Truth.forward

    def counted(self, x, n, out, stream, *rest, **kw):
        if n == 24:  # the whole batch, not the few images whose layers a check samples
            QuickerAfterTheTruth.truth_runs += 1
        return forward(self, x, n, out, stream, *rest, **kw)

    monkeypatch.setattr(Truth, "forward", counted)
    m = measured(QuickerAfterTheTruth)
    assert m.status == "ok", m.error
    assert m.integrity.caching["ratio"] == pytest.approx(1.0), m.integrity.caching


def test_a_memo_keyed_on_part_of_the_input_serves_a_stale_answer_and_is_incorrect():
    for checks in ("full", "fast"):
        m = measured(MemoOnPartOfTheInput, checks=checks)
        assert m.status == "incorrect" and m.error.startswith("timed pass 0: "), m.error


def test_recognising_the_seeds_batch_gains_nothing_no_timed_pass_runs_on_it():
    m = measured(KnowsRoundZero, checks="fast", warmup=3)
    assert m.status == "ok", m.error
    assert 0 not in m.integrity.rounds and m.timings.op_time_ms["conv1"] == pytest.approx(4.25)


def test_a_workspace_is_poisoned_before_every_timed_pass():
    m = measured(ReadsItsWorkspaceFirst)
    assert m.status == "incorrect" and "NaN" in m.error and m.integrity.failed_pass == 0


def test_a_round_that_is_not_visibly_new_does_not_count_and_another_is_timed(monkeypatch):
    first = iter([0.5])
    real = integrity.fresh_share
    monkeypatch.setattr(integrity, "fresh_share", lambda nearest: next(first, None) or real(nearest))
    m = measured(FakeGpuNetwork, checks="fast")
    assert m.status == "ok" and m.integrity.freshness["stale_rounds"] == 1, m.error
    assert m.integrity.fresh_passes == 4 and m.integrity.rounds == [2, 3, 4, 5]  # round 1's pass did not count


def test_a_generator_that_never_makes_a_visibly_new_round_fails_the_setting(monkeypatch):
    from convsweep.device.rounds import Perturbation

    # the random dataset holds exactly the batch: every round sees the same images again, here unchanged
    monkeypatch.setattr(integrity, "PERTURBATION", Perturbation(max_shift=0, gain_lo=1.0, field=0.0, jitter=0.0))
    m = measured(FakeGpuNetwork, dataset="random")
    assert m.status == "failed" and "rounds were not visibly new" in m.error, m.error


def test_writing_part_of_the_output_is_incorrect():
    m = measured(WritesPart)
    assert m.status == "incorrect" and "NaN" in m.error and m.integrity.failed_pass == 0


def test_an_error_just_outside_tolerance_on_a_few_images_is_incorrect():
    m = measured(OffOnAFew)
    assert m.status == "incorrect" and "exceeds the 1e-05 tolerance" in m.error


def test_work_still_running_after_a_pass_makes_the_run_suspect():
    m = measured(FakeGpuNetwork, gpu_class=BusyAfter)
    assert m.status == "suspect" and "still running" in m.error and m.integrity.idle_wait_ms == 2.0


class BusyOnce(FakeGpu):
    """A GPU whose probe sees 2 ms of work once in a run: the host hiccuped while it timed a synchronize."""

    calls = 0

    def idle_wait_ms(self):
        BusyOnce.calls += 1
        return 2.0 if BusyOnce.calls == 4 else self.idle_ms


def test_one_pass_that_seems_to_leave_work_running_is_the_probes_noise_and_not_suspect():
    m = measured(FakeGpuNetwork, gpu_class=BusyOnce)
    assert m.status == "ok", m.error
    assert m.integrity.idle_wait_ms == 2.0  # the longest is still stored


def test_a_persisting_l2_window_set_during_timing_makes_the_run_suspect():
    m = measured(SetsWindow)
    assert m.status == "suspect" and "persisting-L2" in m.error


def test_a_persisting_l2_window_left_before_timing_is_reset_and_said():
    m = measured(SetWindowOnce)
    assert m.status == "ok", m.error
    assert m.integrity.device_state == {"persisting_l2_bytes": 1 << 20, "windows": [0], "reset": True, "problem": None}


def test_a_device_that_cannot_tell_its_l2_state_says_so_and_still_measures():
    class NoPersistingL2(FakeGpu):
        def persisting_l2(self, streams):
            raise RuntimeError("CUDA_ERROR_NOT_SUPPORTED")

    m = measured(FakeGpuNetwork, gpu_class=NoPersistingL2)
    assert m.status == "ok" and "cannot read or reset the persisting-L2 state" in m.integrity.device_state["problem"]


def test_a_graph_timed_job_captures_one_graph_per_host_buffer():
    FakeGpu.captures = 0
    m = measured(FakeGpuNetwork, timer="graph", host_memory="pinned")
    assert m.status == "ok", m.error
    assert FakeGpu.captures == 3  # round 0's buffer (seed, warm-up), and the two the fresh rounds take turns in


# -- the verdicts -------------------------------------------------------------------------------
H100 = Peaks(gpu="H100", compute_capability="9.0", sm_count=132, sm_clock_mhz=1980.0, dram_bytes_per_s=3.35e12,
             l2_bytes=50 * 2**20, pcie_bytes_per_s=63e9,
             flops_per_s={"fp64": 67e12, "fp32": 67e12, "tf32": 535e12, "fp16": 1070e12, "int8": 2140e12})


def timed(op_ms: dict, forward_ms: float, batch: int = 10000) -> Measurement:
    m = Measurement("id", "job", "key", {"variants": {}}, {}, status="ok", images={"batch": batch},
                    timings=Timings(op_time_ms=op_ms, forward_ms=forward_ms),
                    floors={"conv1": {"flops": 2 * 10**10, "bytes": 6 * 10**7}})
    m.integrity = Integrity(checks="full", peaks=H100.to_json())
    return m


def test_a_time_below_the_physical_floor_is_suspect_and_a_time_above_is_not():
    floor = 2 * 10**10 / 2140e12 * 1e3  # the FLOPs at the fastest dense rate: ~0.0093 ms
    fast = timed({"conv1": floor / 2}, 10.0)
    integrity.judge_floors(fast, LENET)
    integrity.settle(fast)
    assert fast.status == "suspect" and "conv1 took" in fast.error and integrity.FLOOR_REASON in fast.error
    assert fast.integrity.floor_ms["conv1"] == pytest.approx(floor)
    # the forward: 10000 fp32 86x86 images over PCIe take 4.7 ms at least
    assert fast.integrity.floor_ms["forward"] == pytest.approx(10000 * 86 * 86 * 4 / 63e9 * 1e3)

    honest = timed({"conv1": floor * 3}, 10.0)
    integrity.judge_floors(honest, LENET)
    integrity.settle(honest)
    assert honest.status == "ok" and honest.error is None


def test_judging_again_with_other_times_replaces_the_floor_reasons():
    m = timed({"conv1": 1e-6}, 10.0)
    integrity.judge_floors(m, LENET)
    integrity.settle(m)
    assert m.status == "suspect"
    m.timings.op_time_ms["conv1"] = 1.0  # nsys's time, say
    integrity.judge_floors(m, LENET)
    integrity.settle(m)
    assert m.status == "ok" and not m.integrity.reasons


def test_nsys_seeing_more_work_than_the_events_timed_is_suspect():
    m = timed({"conv1": 1.0}, 10.0)
    m.timings.event_forward_ms = 10.0
    integrity.judge_nsys(m, 10.4)  # within 5%: launch gaps and event overhead go the other way
    integrity.settle(m)
    assert m.status == "ok"
    integrity.judge_nsys(m, 12.0)
    integrity.settle(m)
    assert m.status == "suspect" and "a stream the timer does not wait for" in m.error


def test_settle_leaves_failed_and_incorrect_runs_alone():
    for status in ("failed", "incorrect"):
        m = timed({"conv1": 1e-6}, 10.0)
        m.status, m.error = status, "it broke"
        integrity.judge_floors(m, LENET)
        integrity.settle(m)
        assert m.status == status and m.error == "it broke"


# -- the caching test's verdict ----------------------------------------------------------------------
def judged(times: list[list[float]], all_ms=(1.0,) * 5) -> Integrity:
    guard = integrity.IntegrityObserver.__new__(integrity.IntegrityObserver)
    guard.all_ms, guard.found = list(all_ms), Integrity(checks="full")
    guard._judge_caching(times)
    return guard.found


@pytest.mark.parametrize("times, suspect", [
    ([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], "sighting 2"),  # a memo that fills at once
    ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5]], "sighting 3"),  # one that waits for a third sighting
    ([[1.0, 1.0, 1.0], [0.85, 1.02, 0.99], [1.0, 0.98, 1.01]], None),  # one slow first launch
    ([[1.0, 1.0, 1.0], [0.97, 0.97, 0.96], [0.97, 0.96, 0.97]], None),  # within 5%
])
def test_the_caching_test_needs_every_round_faster_at_a_later_sighting(times, suspect):
    found = judged(times)
    assert (found.reasons[0].split(" of a round")[0].endswith(suspect) if suspect else not found.reasons), found.reasons
    assert found.caching["ratios"][0] == [b / a for a, b in zip(times[0], times[1])]


class Layered(FakeGpuNetwork):
    """A fake network with the runner's steps and lanes: each conv step writes its own output into
    its lane's buffer (as GpuNetwork does), where the integrity checks sample it."""

    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        from convsweep.measure.runner import Lane

        self.steps = network.steps({name: var.fuses for name, var in plan.variants.items()})
        self.lanes = [Lane(capacity, {s.layer.name: gpu.alloc((capacity, *s.last.out_shape), np.float32)
                                      for s in self.steps if s.layer.is_conv}) for _ in range(lanes)]

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        from convsweep.model.network import reference_layer

        out, buffer, conv = self.gpu.read(x.rows(0, n)).astype(np.float64), None, None
        for layer in self.network.layers:
            out = reference_layer(layer, {k: v.astype(np.float64) for k, v in self.weights.items()}, out)
            if layer.name in lane.outputs:  # a conv step's own buffer; a ReLU after it works in place
                buffer, conv = lane.outputs[layer.name], layer.name
            elif layer.kind.owns_output:
                buffer = None
            if buffer is not None and out.shape[1:] == buffer.shape[1:]:
                self.gpu.read(buffer.rows(0, n))[...] = self.conv_output(conv, out)
        self.gpu.read(logits.rows(0, n))[...] = out

    def conv_output(self, name, out):
        return out


class KeepsAWrongLayer(Layered):
    """Right logits, but what it leaves as conv2's output is off by 1% (a buffer it never finished)."""

    def conv_output(self, name, out):
        return out * 1.01 if name == "conv2" else out


def test_each_conv_layer_run_on_its_own_is_checked_on_a_sample_of_its_output():
    assert measured(Layered).status == "ok"
    m = measured(KeepsAWrongLayer)
    assert m.status == "incorrect" and m.error.startswith("timed pass 0: conv2's output: max relative error")


@pytest.mark.parametrize("pass_ms, rounds", [(5.0, 3), (1.0, 5), (0.8, 7), (0.15, 9), (0.001, 9), (0.0, 3),
                                             (float("nan"), 3)])
def test_short_passes_get_more_caching_rounds_so_noise_is_not_a_memo(pass_ms, rounds, monkeypatch):
    """A memo is quicker in every round; an honest 0.15 ms pass was 0.89x in each of 3 on the lent H100 (one run of
    37 `suspect`). Rounds grow until the test times ~15 ms of passes, 9 at most (the other CPU tests keep 3:
    conftest.py)."""
    monkeypatch.setattr(integrity, "CACHING_TIMED_MS", 15.0)
    assert integrity.caching_rounds(pass_ms) == rounds


def test_a_fake_job_of_short_passes_times_nine_caching_rounds(monkeypatch):
    monkeypatch.setattr(integrity, "CACHING_TIMED_MS", 15.0)
    m = measured(FakeGpuNetwork)
    assert m.status == "ok" and m.integrity.caching["rounds"] == 9 and len(m.integrity.caching["times_ms"][0]) == 9
