"""The integrity checks without a GPU: each detector of convsweep.integrity against a numpy network
that cheats the way a red-team kernel does (tests/redteam/ has the real ones, caught on the device),
and the verdicts, floors, rounds and budget on their own."""
import numpy as np
import pytest

from convsweep import integrity
from convsweep.config import RunSpec
from convsweep.inputs import load_batch
from convsweep.measure import measure
from convsweep.network import load_network, reference_forward
from convsweep.peaks import Peaks
from convsweep.record import Integrity, Measurement, Timings

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
    assert found.fresh_passes == 4 and found.caching["passes"] == [integrity.CACHING_PASSES] * 2
    assert found.device_state["reset"] is False and not found.reasons
    assert 0.99 <= found.caching["ratio"] <= 1.01  # the same work, fresh or repeated


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
    assert m.status == "suspect" and "caching test" in m.error
    caching = m.integrity.caching
    assert caching["ratio"] < 1 - caching["threshold"]
    assert any("caching test" in r for r in m.integrity.reasons)


def test_with_fast_checks_no_fresh_inputs_and_no_caching_test_and_the_result_says_so():
    m = measured(MemoByValue, checks="fast")
    assert m.status == "ok" and m.spec["checks"] == "fast"
    assert m.integrity.checks == "fast" and m.integrity.fresh_passes == 0 and m.integrity.caching is None
    assert m.integrity.checked_passes == 4  # every pass is still checked


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


def test_a_graph_timed_job_captures_one_graph_per_round():
    FakeGpu.captures = 0
    m = measured(FakeGpuNetwork, timer="graph", host_memory="pinned")
    assert m.status == "ok", m.error
    assert FakeGpu.captures == 1 + 4 + 3  # round 0 (seed, warm-up), 4 timed rounds, 3 of the caching test


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


# -- rounds and their budget --------------------------------------------------------------------
def test_rounds_are_new_images_that_keep_their_labels_and_have_exact_references():
    batch = load_batch(LENET, "mnist5k", 30)
    rounds = [batch.round_images(r) for r in range(4)]
    flat = np.concatenate([r.reshape(len(r), -1) for r in rounds])
    assert len(np.unique(flat, axis=0)) == len(flat)  # no image repeats, within or across rounds
    weights = {k: v.astype(np.float64) for k, v in batch.weights.items()}
    for r in (1, 3):
        expected = reference_forward(LENET, weights, rounds[r].astype(np.float64))
        assert np.array_equal(batch.round_reference(r), expected)
        # a shifted digit is still its digit: the reference classifies the round about as well as round 0
        accuracy = np.mean(np.argmax(expected, 1) == batch.dataset.labels[batch.round_index(r)])
        assert accuracy >= 0.9


def test_a_batch_larger_than_the_dataset_still_gets_distinct_images_in_fresh_rounds():
    batch = load_batch(LENET, "mnist5k", 10000)
    images = batch.round_images(1).reshape(10000, -1)
    assert len(np.unique(images[:, ::7], axis=0)) == 10000  # round 0 repeats each image; round 1 does not
    assert batch.fresh_rounds_available == 12


def test_fresh_rounds_are_one_per_timed_pass_and_three_for_the_caching_test_within_the_budget():
    per_image = 10e6  # LeNet-86's float64 reference, about
    assert integrity.fresh_rounds(100, 20, "full", 1200, per_image) == (20, 3)
    assert integrity.fresh_rounds(10000, 20, "full", 12, per_image) == (0, 2)  # 20,000 reference images
    assert integrity.fresh_rounds(1, 20, "full", 10, 164e9 * 2) == (0, 1)  # a huge network: the test's one
    assert integrity.fresh_rounds(5000, 5, "full", 24, per_image) == (2, 2)
    assert integrity.fresh_rounds(100, 500, "full", 1200, per_image) == (integrity.MAX_FRESH_ROUNDS - 3, 3)
    assert integrity.fresh_rounds(100, 20, "fast", 1200, per_image) == (0, 0)


def test_the_caching_test_runs_each_of_its_fresh_rounds_twice_in_a_row():
    class Rounds:
        fresh, caching, current = 2, 3, 0

        def of_pass(self, i):
            return 1 + i % 2

    seen = []
    guard = integrity.IntegrityObserver.__new__(integrity.IntegrityObserver)
    guard.rounds, guard.all_ms, guard.found = Rounds(), [1.0, 1.0, 1.0], Integrity(checks="full")
    guard._state_after = guard._poison = lambda: None
    guard.busy_after = []
    guard._warm_transfer = lambda r: seen.append(f"copy {r}")
    guard._checked = lambda what, r: seen.append(r)
    guard.timed_pass, guard.pass_ms = lambda: None, lambda reading: 1.0
    guard.finish(0.0, lambda: None)
    # a warm-up over a round the timed passes saw (1), then rounds none saw (1 and 2 are theirs), each fresh then
    # again, each pass after an untimed copy of its images
    assert seen == [1, "copy 3", 3, "copy 3", 3, "copy 4", 4, "copy 4", 4, "copy 5", 5, "copy 5", 5]
    assert guard.found.caching["passes"] == [3, 3] and guard.found.caching["ratio"] == 1.0


class Layered(FakeGpuNetwork):
    """A fake network with the runner's steps and lanes: each conv step writes its own output into
    its lane's buffer (as GpuNetwork does), where the integrity checks sample it."""

    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        from convsweep.runner import Lane

        self.steps = network.steps({name: var.fuses for name, var in plan.variants.items()})
        self.lanes = [Lane(capacity, {s.layer.name: gpu.alloc((capacity, *s.last.out_shape), np.float32)
                                      for s in self.steps if s.layer.is_conv}) for _ in range(lanes)]

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        from convsweep.network import reference_layer

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


@pytest.mark.parametrize("pairs, suspect", [([(1.0, 0.5), (1.0, 0.5), (1.0, 0.5)], True),  # a cache: every pair
                                            ([(1.0, 0.85), (1.0, 1.02), (1.0, 0.99)], False),  # one slow launch
                                            ([(1.0, 0.97), (1.0, 0.97), (1.0, 0.96)], False)])  # within 5%
def test_the_caching_test_needs_every_pair_faster_on_its_second_pass(pairs, suspect):
    class Rounds:
        fresh, caching, current = 0, 3, 0

        def of_pass(self, i):
            return 0

    times = iter(t for pair in pairs for t in pair)
    guard = integrity.IntegrityObserver.__new__(integrity.IntegrityObserver)
    guard.rounds, guard.all_ms, guard.found = Rounds(), [1.0] * 5, Integrity(checks="full")
    guard._state_after = guard._poison = lambda: None
    guard.busy_after = []
    guard._warm_transfer = lambda r: None
    guard._checked = lambda what, r: None
    guard.timed_pass, guard.pass_ms = lambda: None, lambda reading: next(times)
    guard.finish(0.0, lambda: None)
    assert bool(guard.found.reasons) is suspect
    assert guard.found.caching["pair_ratios"] == [b / a for a, b in pairs]
