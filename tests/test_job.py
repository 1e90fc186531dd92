"""Jobs end to end on the CPU: the reference variant, grids of settings over a numpy GPU, failures
that are stored, not lost, machines that cannot run a job, and interrupted jobs that resume."""
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from convsweep.measure import context as context_mod
from convsweep.measure import job as job_mod
from convsweep.sweep.config import JobSpec, RunSpec
from convsweep.base.errors import CompileError, ConvsweepError, MachineError, writing
from convsweep.device.gpu import gpu_available, no_gpu
from convsweep.measure.job import run_job as run_one_job
from convsweep.measure.record import Measurement, SettingCounts

import fake_gpu
from fake_gpu import FAKE, FakeEvent, FakeGpuNetwork, SlowingMonitor, SteadyClock, SteppingEveryEighthRead


@pytest.fixture(scope="module", autouse=True)
def fake_forward_once_per_batch():
    """The fake GPU network's forward pass (fake_gpu.FakeGpuNetwork: the whole network in float32 numpy) of the
    same images through the same network and weights is the same array: made once a module and handed out as
    a copy. A grid job's settings and their passes see a few batches over and over (78 passes, 31 distinct
    batches, in one resumed grid), and every test of the module runs the same jobs' first batches again."""
    made: dict[tuple, np.ndarray] = {}
    real = fake_gpu.reference_forward

    def digest(array) -> bytes:
        array = np.ascontiguousarray(array)
        return hashlib.blake2b(array.view(np.uint8).reshape(-1), digest_size=20).digest()

    def forward(network, weights, x, dtype=np.float64, quiet=False):
        x = np.asarray(x)
        key = (network, np.dtype(dtype).str, x.dtype.str, x.shape, digest(x),
               tuple((name, w.dtype.str, w.shape, digest(w)) for name, w in sorted(weights.items())))
        if key not in made:  # a Network is a frozen dataclass: equal descriptions, equal key
            made[key] = real(network, weights, x, dtype=dtype, quiet=quiet)
        return made[key].copy()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fake_gpu, "reference_forward", forward)
        yield


SWEEP = {"experiment": "t", "config_hash": "h", "config_path": "x.yaml"}


def spec(**over) -> JobSpec:
    """A lone job: one setting."""
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "reference", "conv2": "reference"}, params={"conv1": {}, "conv2": {}},
                batch=40, streams=1, host_memory="pageable", repeats=2, warmup=1, profiler="events")
    base.update(over)
    return JobSpec.for_run(RunSpec(**base), sweep=SWEEP)


def run_job(job: JobSpec, out, **kwargs) -> Measurement:
    """A lone job's one measurement."""
    result = run_one_job(job, out, **kwargs)
    assert len(result.measurements) == 1
    return result.measurements[0]


def test_reference_job_writes_a_complete_result(tmp_path):
    out = tmp_path / "r.json"
    job = run_one_job(spec(), out, process_age=None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(job.to_json()))
    assert job.format == 3 and job.job_id == spec().job_id and job.job_key == spec().job_key
    assert job.settings == SettingCounts(valid=1, measured=1, resumed=0)
    stored = job.measurements[0]
    assert stored.status == "ok", stored.error
    assert stored.profiler == "cpu" and stored.grid.index == 0
    assert stored.max_rel_err < 1e-5 and 0.8 < stored.accuracy <= 1.0
    assert set(stored.timings.op_time_ms) == {"conv1", "conv2"}
    assert all(v > 0 for v in stored.timings.op_time_ms.values())
    assert stored.timings.h2d_ms is None  # not measurable on the CPU: null, never guessed
    assert len([s for s in stored.samples if s.metric == "op_time_ms"]) == 2 * 2
    assert stored.run_key == spec().runs()[0].run_key and stored.job_id == spec().job_id
    assert stored.images == {"batch": 40, "unique": 5000, "cycled": False, "input_bytes": 40 * 86 * 86 * 4,
                             "logits_bytes": 40 * 10 * 4, "tail_images": 40}
    assert stored.floors["conv2"]["flops"] == 2 * 40 * 16 * 34 * 34 * 4 * 49
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left nothing behind


def test_process_age_is_the_start_phase_and_counted_in_total_s(tmp_path):
    t = time.perf_counter()
    result = run_job(spec(profiler="events"), tmp_path / "r.json", process_age=1.5)
    wall = time.perf_counter() - t
    phases = result.phases_s
    assert phases["process_start"] == 1.5  # not replaced by the measured phases
    assert {"load", "warmup", "timed", "check"} <= set(phases)
    assert sum(phases.values()) <= result.timings.total_s <= 1.5 + wall


def test_batches_larger_than_the_set_cycle_and_say_so(tmp_path):
    """A batch one image larger than its set: a set of six IDX images, not mnist5k's 5,000 (batch 5003 made
    the CPU reference forward 5,003 images, the suite's slowest test at ~100 s)."""
    from test_data import write_idx

    rng = np.random.default_rng(5003)
    dataset = {"name": "six", "images": str(write_idx(tmp_path / "images.idx", rng.integers(0, 256, (6, 28, 28)))),
               "labels": str(write_idx(tmp_path / "labels.idx", rng.integers(0, 10, 6)))}
    whole = run_job(spec(dataset=dataset, batch=6, repeats=1, warmup=0), tmp_path / "whole.json")
    assert whole.status == "ok" and whole.images["cycled"] is False, whole.error
    result = run_job(spec(dataset=dataset, batch=7, repeats=1, warmup=0), tmp_path / "r.json")
    assert result.status == "ok" and result.images["cycled"] is True, result.error


def test_missing_dataset_is_a_stored_failure(tmp_path):
    bad = spec(dataset={"name": "fashion", "images": str(tmp_path / "nope-images.gz"), "labels": str(tmp_path / "nope-labels.gz")})
    result = run_job(bad, tmp_path / "r.json")
    assert result.status == "failed" and "nope-images.gz" in result.error
    assert json.loads((tmp_path / "r.json").read_text())["measurements"][0]["status"] == "failed"


@pytest.mark.skipif(gpu_available()[0], reason="checks a machine without a GPU")
def test_a_gpu_job_on_a_machine_without_a_gpu_is_no_result(tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(MachineError, match=r"^no NVIDIA GPU or driver on this machine \(.+\)$") as caught:
        run_one_job(spec(variants={"conv1": "naive", "conv2": "naive"}), out)
    assert "\n" not in str(caught.value)
    assert not out.exists() and not list(tmp_path.glob("r.partial/*"))


def test_random_workloads_run_on_the_cpu_reference(tmp_path):
    job = spec(network="networks/fp64_stride5.yaml", dataset="random", variants={"conv1": "reference"},
               params={"conv1": {}}, batch=16)
    result = run_job(job, tmp_path / "r.json")
    assert result.status == "ok", result.error
    assert result.accuracy is None and result.prediction_agreement is None
    assert result.max_rel_err < 1e-12  # float64 network, float64 CPU reference
    assert result.floors["conv1"]["bytes"] == 8 * (16 * 100 * 100 + 10 * 25 + 10 + 16 * 10 * 20 * 20)


def test_each_run_is_a_new_measurement_with_its_provenance(tmp_path):
    import subprocess

    from convsweep.device.compile import source_hash
    from convsweep.base.paths import KERNELS_DIR, ROOT

    first = run_job(spec(batch=8, repeats=1, warmup=0), tmp_path / "r.json")
    again = run_job(spec(batch=8, repeats=1, warmup=0), tmp_path / "r.json")
    assert first.run_key == again.run_key and first.measurement_id != again.measurement_id
    assert len(first.measurement_id) == 32
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert first.git["commit"] == head.stdout.strip() and isinstance(first.git["dirty"], bool)
    assert first.clocks == {"sm_mhz": None, "memory_mhz": None}  # no GPU timed: null, never guessed
    assert first.sources == {}  # the CPU reference runs no kernel
    gpu_job = run_job(spec(variants={"conv1": "naive", "conv2": "naive"}, batch=8), tmp_path / "g.json", backend=FAKE)
    # Known before anything compiles, so even a run that failed says what code it tried
    assert gpu_job.sources == {"kernels/naive.cu": source_hash(KERNELS_DIR / "naive.cu"),
                                  "kernels/layers.cu": source_hash(KERNELS_DIR / "layers.cu")}


def test_a_killed_writers_temporary_files_are_cleared(tmp_path):
    out = tmp_path / "r.json"
    stale = tmp_path / ".r.json.abc123.tmp"
    stale.write_text('{"half": ')
    run_job(spec(batch=8, repeats=1, warmup=0), out)
    assert not stale.exists() and json.loads(out.read_text())["measurements"][0]["status"] == "ok"


# -- grids: one process, every setting its own measurement -----------------------------------------
BLOCKS = [64, 128, 256, 512, 1024]


def grid_job(**over) -> JobSpec:
    """naive on both conv layers, its five BLOCK sizes as one job."""
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"},
                grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": BLOCKS}}],
                batch=8, streams=1, host_memory="pageable", repeats=2, warmup=1, profiler="events", sweep=SWEEP)
    base.update(over)
    return JobSpec(**base)


class GridNetwork(FakeGpuNetwork):
    """The fake network, but BLOCK=1024 does not compile and BLOCK=512 gets conv wrong; every
    network built is counted by its BLOCK, and `interrupt_at` stops the job like a Ctrl-C."""

    built: list[int] = []
    interrupt_at: int | None = None

    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        block = plan.params["conv1"]["BLOCK"]
        if block == self.interrupt_at:
            raise KeyboardInterrupt
        GridNetwork.built.append(block)
        if block == 1024:
            raise CompileError("kernels/naive.cu:12: error: BLOCK too large (variant 'naive', NVRTC)")
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        self.wrong = block == 512

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        super().enqueue(stream, lane, x, logits, n, events, flush)
        if self.wrong:
            self.gpu.read(logits.rows(0, n))[...] += 1.0


GRID = type(FAKE)(gpu=FAKE.gpu, conv_op=FAKE.conv_op, network=GridNetwork, compile_all=FAKE.compile_all)


@pytest.fixture(autouse=True)
def fresh_grid_network():
    GridNetwork.built, GridNetwork.interrupt_at = [], None


def test_a_grid_job_stores_every_setting_and_its_failures_beside_the_others(tmp_path):
    job = grid_job()
    result = run_one_job(job, tmp_path / "grid.json", process_age=0.5, backend=GRID)
    ms = result.measurements
    assert [m.params["conv1"]["BLOCK"] for m in ms] == BLOCKS  # grid order
    assert all(m.params["conv2"] == m.params["conv1"] for m in ms)  # the grid ties the layers
    assert [m.status for m in ms] == ["ok", "ok", "ok", "incorrect", "failed"]
    assert "tolerance" in ms[3].error and ms[4].error.startswith("kernels/naive.cu:12: error: BLOCK too large")
    assert len({m.run_key for m in ms}) == len({m.measurement_id for m in ms}) == 5
    assert [r.run_key for r in job.runs()] == [m.run_key for m in ms]
    for i, m in enumerate(ms):
        assert m.job_id == job.job_id and m.grid.to_json() == {"job_key": job.job_key, "index": i, "settings": 5,
                                                               "valid": 5, "search": {"strategy": "grid"}}
        if m.status != "failed":
            assert len([s for s in m.samples if s.metric == "op_time_ms"]) == 2 * 2
            assert m.timings.op_time_ms["conv1"] > 0 and m.environment["gpu"] == "Fake H100"
    assert GridNetwork.built == BLOCKS  # one process measured them all, one after another
    # The job's time is shared out: the settings' total_s add up to its wall time, process start included.
    assert sum(m.timings.total_s for m in ms) == pytest.approx(result.total_s)
    assert all(m.phases_s["process_start"] == pytest.approx(0.1) for m in ms)
    assert result.settings == SettingCounts(valid=5, measured=5, resumed=0)
    assert not (tmp_path / "grid.partial").exists()


def test_a_setting_cannot_pass_with_the_logits_of_the_one_before(tmp_path):
    """Each setting starts from poisoned logits: a network that writes nothing is incorrect."""

    class Silent(GridNetwork):
        def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
            if self.wrong:  # BLOCK=512 writes nothing at all (its events still tick)
                for layer in self.network.conv_layers:
                    events.setdefault(layer.name, []).append((FakeEvent(), FakeEvent()))
                return
            super().enqueue(stream, lane, x, logits, n, events, flush)

    backend = type(FAKE)(gpu=FAKE.gpu, conv_op=FAKE.conv_op, network=Silent, compile_all=FAKE.compile_all)
    ms = run_one_job(grid_job(), tmp_path / "grid.json", backend=backend).measurements
    assert ms[3].status == "incorrect" and "NaN" in ms[3].error


def test_an_interrupted_grid_measures_only_what_is_missing_when_run_again(tmp_path):
    out = tmp_path / "grid.json"
    GridNetwork.interrupt_at = 256
    with pytest.raises(KeyboardInterrupt):
        run_one_job(grid_job(), out, backend=GRID)
    assert not out.exists() and GridNetwork.built == [64, 128]
    kept = sorted((tmp_path / "grid.partial").glob("*.json"))
    assert len(kept) == 2
    first = {json.loads(p.read_text())["measurement"]["run_key"]: json.loads(p.read_text())["measurement"]["measurement_id"]
             for p in kept}

    GridNetwork.built, GridNetwork.interrupt_at = [], None
    result = run_one_job(grid_job(), out, backend=GRID)
    assert GridNetwork.built == [256, 512, 1024]  # only the settings without a stored result
    assert result.settings == SettingCounts(valid=5, measured=3, resumed=2)
    ms = result.measurements
    assert [m.status for m in ms] == ["ok", "ok", "ok", "incorrect", "failed"]
    assert {m.run_key: m.measurement_id for m in ms[:2]} == first  # the same measurements, not new ones
    assert not (tmp_path / "grid.partial").exists()

    # Once the file is written the job is done: running it again is a new measurement of every setting.
    GridNetwork.built = []
    run_one_job(grid_job(), out, backend=GRID)
    assert GridNetwork.built == BLOCKS


def test_an_edited_kernel_remeasures_every_setting_of_an_interrupted_grid(tmp_path, monkeypatch):
    out = tmp_path / "grid.json"
    GridNetwork.interrupt_at = 256
    with pytest.raises(KeyboardInterrupt):
        run_one_job(grid_job(), out, backend=GRID)
    real = context_mod.kernel_sources_of
    monkeypatch.setattr(context_mod, "kernel_sources_of",
                        lambda variants: {name: "edited" for name in real(variants)})
    GridNetwork.built, GridNetwork.interrupt_at = [], None
    result = run_one_job(grid_job(), out, backend=GRID)
    assert GridNetwork.built == BLOCKS and result.settings.resumed == 0
    assert all(m.sources["kernels/naive.cu"] == "edited" for m in result.measurements)


def test_a_failure_before_any_setting_runs_is_every_settings_failure(tmp_path):
    missing = {"name": "fashion", "images": str(tmp_path / "nope-images.gz"), "labels": str(tmp_path / "nope-labels.gz")}
    ms = run_one_job(grid_job(dataset=missing), tmp_path / "grid.json", backend=GRID).measurements
    assert len(ms) == 5 and all(m.status == "failed" and "nope-images.gz" in m.error for m in ms)
    assert GridNetwork.built == []


def test_a_random_search_measures_its_seeded_sample(tmp_path):
    search = {"strategy": "random", "max_settings": 3, "seed": 7}
    job = grid_job(search=search)
    picked = [r.params["conv1"]["BLOCK"] for r in job.runs()]
    assert len(picked) == 3 and picked == sorted(picked, key=BLOCKS.index)  # grid order
    assert [r.params for r in grid_job(search=search, batch=48).runs()] == [r.params for r in job.runs()]
    ms = run_one_job(job, tmp_path / "grid.json", backend=GRID).measurements
    assert [m.params["conv1"]["BLOCK"] for m in ms] == picked == GridNetwork.built
    assert all(m.grid.valid == 5 and m.grid.search == search for m in ms)


# -- the slow starts first: light imports, nsys started before the job has prepared -----------------
def test_a_job_process_imports_no_heavy_module_before_it_starts_nsys_or_the_cuda_context():
    """run_job starts `nsys profile` (~2 s) or the CUDA context (~0.45 s) before it imports numpy,
    cuda.core or the network, so those imports overlap the slow starts instead of adding to them."""
    code = ("import sys, convsweep.app.cli, convsweep.measure.job; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'numpy', 'cuda', 'jsonschema', 'sqlalchemy', 'alembic', 'pynvml'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


FAKE_NSYS = """
import json, sqlite3, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
base, command = Path(args[args.index("-o") + 1]), args[args.index("-o") + 2:]
spec = json.loads(Path(command[command.index("--spec-file") + 1]).read_text())
(base.parent / "child-settings.json").write_text(json.dumps(spec["settings"]))
rc = subprocess.run(command).returncode
sqlite3.connect(base.with_suffix(".sqlite")).close()
base.with_suffix(".nsys-rep").write_bytes(b"")
sys.exit(rc)
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    """An `nsys` that runs the command unprofiled, writes an empty export, and notes which settings
    the child was asked for."""
    script = tmp_path / "bin" / "nsys"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n{FAKE_NSYS}")
    script.chmod(0o755)
    monkeypatch.setenv("NSYS", str(script))
    return script


@pytest.mark.skipif(gpu_available()[0], reason="checks the nsys plumbing where the child cannot open a GPU")
def test_under_nsys_a_fresh_job_starts_its_child_for_every_setting_at_once(tmp_path, fake_nsys):
    """The child under nsys cannot open a GPU here: it tells its parent, whose job is the machine's
    failure (no result file), not five failed settings."""
    out = tmp_path / "runs" / "grid.json"
    with pytest.raises(MachineError, match=r"^no NVIDIA GPU or driver on this machine \("):
        run_one_job(grid_job(profiler="nsys"), out)
    assert json.loads((out.parent / "child-settings.json").read_text()) is None  # all: before the job read its grid
    assert not out.exists() and not list(out.parent.glob("grid.partial/*"))


@pytest.mark.skipif(gpu_available()[0], reason="checks the nsys plumbing where the child cannot open a GPU")
def test_under_nsys_a_resumed_job_asks_its_child_for_the_missing_settings_only(tmp_path, fake_nsys):
    out = tmp_path / "runs" / "grid.json"
    job = grid_job(profiler="nsys")
    ctx = context_mod.JobContext.open(job)
    kept = ctx.measurement(0)
    kept.timings.total_s = 0.0
    job_mod.ResumeStore(out, job_mod.resume_key(ctx)).put(kept)
    with pytest.raises(MachineError):
        run_one_job(job, out)
    assert json.loads((out.parent / "child-settings.json").read_text()) == [1, 2, 3, 4]
    assert not out.exists() and len(list(out.parent.glob("grid.partial/*.json"))) == 1  # still there to resume


# -- repeats auto: the stopping rule decides, and each measurement says why it stopped ------------
def test_repeats_auto_samples_each_setting_until_its_rule_stops(tmp_path):
    rule = {"max_noise": 0.005, "min_samples": 4, "min_time_s": 0.0, "timeout_s": 15}
    ms = run_one_job(grid_job(repeats="auto", stopping=rule), tmp_path / "grid.json", backend=GRID).measurements
    for m in ms[:4]:  # the fake clock's passes are all alike: quiet at once, so the fourth sample ends it
        forward = [s.value for s in m.samples if s.metric == "forward_ms"]
        assert len(forward) == 4 and len(set(forward)) == 1
        assert m.stopping.to_json() == {"rule": "auto", "reason": "converged", "samples": 4, "noise": 0.0,
                                        "measured_s": pytest.approx(sum(forward) / 1e3)}
        assert m.spec["repeats"] == "auto" and m.spec["stopping"] == rule
    assert ms[4].status == "failed" and ms[4].stopping is None  # never timed


def test_a_fixed_count_says_so_and_a_timeout_stops_the_cpu_reference(tmp_path):
    fixed = run_job(spec(), tmp_path / "fixed.json")
    assert fixed.stopping.rule == "fixed" and fixed.stopping.samples == 2
    rule = {"max_noise": 1e-9, "min_samples": 50, "min_time_s": 0.0, "timeout_s": 0.05}  # cannot converge
    timed_out = run_job(spec(repeats="auto", stopping=rule), tmp_path / "auto.json")
    assert timed_out.status == "ok" and timed_out.stopping.reason == "timeout"
    assert 1 <= timed_out.stopping.samples < 50


# -- what the numbers were measured under: cache state, clocks, slowdowns, energy ----------------
def test_a_cold_job_writes_over_l2_before_every_conv_layer_and_times_around_it(tmp_path):
    from fake_gpu import FakeGpu

    FakeGpu.flushes = 0
    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}], repeats=3, warmup=1, cache="cold")
    assert job.job_id.endswith(f"-pageable-cold-{job.job_key[:10]}") and job.runs()[0].to_dict()["cache"] == "cold"
    m = run_one_job(job, tmp_path / "cold.json", backend=FAKE).measurements[0]
    assert m.status == "ok" and m.spec["cache"] == "cold"
    # two conv layers, every pass alike: the checked seed pass (the one warm-up), 3 timed, and the caching test's
    # warm-up pass and its 3 rounds of 3 sightings (the CPU tests keep 3 rounds: conftest.py)
    caching = m.integrity.caching["rounds"] * m.integrity.caching["sightings"]
    assert caching == 9 and FakeGpu.flushes == 2 * (1 + 3 + 1 + caching)
    # Every fake event ticks 0.25: a pass is start, h2d end, 2 x (flush pair, layer pair), d2h start,
    # end = 12 events, 2.75 from start to end; the two flushes (0.25 each) are left out of the pass.
    forward = [s.value for s in m.samples if s.metric == "forward_ms"]
    assert forward == [pytest.approx(2.75 - 0.5)] * 3
    assert [s.value for s in m.samples if s.metric == "l2_flush_ms"] == [pytest.approx(0.5)] * 3
    warm = run_one_job(grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}], repeats=3),
                       tmp_path / "warm.json", backend=FAKE).measurements[0]
    assert FakeGpu.flushes == 2 * (1 + 3 + 1 + caching) and "cache" not in warm.spec  # warm: no flush
    assert not [s for s in warm.samples if s.metric == "l2_flush_ms"]


def test_a_setting_records_its_clocks_slowdowns_and_energy(tmp_path):
    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}], repeats=20)
    backend = dataclasses.replace(FAKE, monitor=SlowingMonitor)
    m = run_one_job(job, tmp_path / "r.json", backend=backend).measurements[0]
    assert m.status == "ok"
    assert m.clocks == {"sm_mhz": 1980, "memory_mhz": 2619}
    assert m.clocks_after == {"sm_mhz": 1755, "memory_mhz": 2619}
    assert m.throttle == {"reasons": ["sw_power_cap"], "repeats": [1, 3]}
    assert m.note == "2 of 20 timed passes ran with the clocks held down (sw_power_cap)"
    # The counter steps 2.5 J each pass: about 2.5 J a pass (the fake's passes are not all equally long).
    assert m.energy["passes"] == 20 and m.energy["joules_per_pass"] == pytest.approx(2.5, rel=0.5)
    assert m.energy["joules"] == pytest.approx(m.energy["watts"] * m.phases_s["timed"])


@pytest.mark.parametrize("window_s", [0.5, 0.0])
def test_a_timed_part_too_short_for_the_counter_is_followed_by_untimed_passes(tmp_path, window_s):
    """The host clock is a steady one handed in (every pass alike, however loaded the machine), so
    how many untimed passes the counter needs is known exactly."""
    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}], repeats=3,
                   energy_window_s=window_s)
    backend = dataclasses.replace(FAKE, monitor=SteppingEveryEighthRead, clock=SteadyClock(0.001))
    m = run_one_job(job, tmp_path / "r.json", backend=backend).measurements[0]
    assert m.status == "ok" and m.stopping.samples == 3
    if window_s == 0:
        assert m.energy is None and "energy" not in m.phases_s
        return
    energy = m.energy
    # Readings 1-4 bracket the timed passes; the counter steps at the 8th, 16th and 24th. The 8th and
    # 16th lie 8 passes apart, fewer than MIN_SPAN_PASSES: the power is known at the 24th, 20 passes on.
    assert energy["passes"] == 3 and energy["extra_passes"] == 20
    assert m.phases_s["energy"] == pytest.approx(20 * 0.002 + 0.001)  # two clock reads a pass, one to end
    assert energy["watts"] == pytest.approx(2 * 20.0 / (16 * 2 * 0.001))  # 40 J over 16 passes of 2 ms
    assert energy["joules_per_pass"] == pytest.approx(energy["watts"] * m.phases_s["timed"] / 3)
    assert len([s for s in m.samples if s.metric == "forward_ms"]) == 3  # the untimed passes are no samples


def test_the_energy_window_bounds_the_untimed_passes(tmp_path):
    """A window that ends before the counter has stepped far enough: the passes stop, the power stays unknown."""
    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}], repeats=3,
                   energy_window_s=0.0105)
    backend = dataclasses.replace(FAKE, monitor=SteppingEveryEighthRead, clock=SteadyClock(0.001))
    m = run_one_job(job, tmp_path / "r.json", backend=backend).measurements[0]
    assert m.status == "ok" and m.energy is None
    # Five passes (two reads each) began inside the 10.5 ms; the check that ended it and the phase's read add 2 ms.
    assert m.phases_s["energy"] == pytest.approx(0.012)


def test_without_nvml_nothing_is_guessed(tmp_path):
    m = run_one_job(grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}]), tmp_path / "r.json",
                    backend=FAKE).measurements[0]
    assert m.status == "ok"
    assert (m.throttle, m.note, m.energy) == (None, None, None)
    assert m.clocks_after == {"sm_mhz": None, "memory_mhz": None}


def test_a_fused_network_job_times_one_layer_and_builds_one_variant(tmp_path):
    """fp16_fused_network at conv1 computes conv2 too: the job has one timed layer, one op time, one
    variant build (layers.cu aside), even when the spec names conv2 as well."""
    from convsweep.measure.context import JobContext
    from convsweep.measure.settings import build_requests

    job = spec(variants={"conv1": "fp16_fused_network", "conv2": "fp16_fused_network"},
               params={"conv1": {"BLOCKS": 132}, "conv2": {}}, batch=24)
    ctx = JobContext.open(job)
    assert list(ctx.variants) == ["conv1"]
    builds = build_requests(ctx.network, ctx.variants, ctx.runs[0])
    assert [b.name for b in builds] == ["layers", "fp16_fused_network"]
    assert dict(builds[1].macros)["N2_FIXED"] == 10 and dict(builds[1].macros)["BLOCKS"] == 132
    m = run_job(job, tmp_path / "r.json", backend=FAKE)
    assert m.status == "ok", m.error
    assert list(m.timings.op_time_ms) == ["conv1"] and list(m.floors) == ["conv1"]
    assert {s.layer for s in m.samples if s.metric == "op_time_ms"} == {"conv1"}
    # the floor of a kernel that runs the whole network: the images, every weight and the logits
    assert m.floors["conv1"]["bytes"] == 4 * (24 * 86 * 86 + 4 * 49 + 4 + 16 * 4 * 49 + 16 + 1024 * 32 + 32
                                                 + 32 * 10 + 10 + 24 * 10)


def test_a_job_opens_the_gpu_only_under_its_lock_and_closes_it_before_letting_go(tmp_path, monkeypatch):
    """Another process's CUDA start-up slows timed kernels, so CUDA starts (the GPU is opened) only
    once the job holds the GPU's lock, bound to that GPU; and the lock outlives the GPU's closing."""
    import os

    from fake_gpu import FakeGpu

    from convsweep.device import provenance
    from convsweep.device.gpulock import lock_path
    from convsweep.measure.runner import Backend

    monkeypatch.setenv("CONVSWEEP_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(provenance, "gpu_uuids", lambda: [f"GPU-{FakeGpu.uuid}"])  # NVML sees this one GPU
    lock = lock_path(FakeGpu.uuid)
    seen = []

    def held() -> bool:
        return lock.is_file() and lock.read_text().startswith(f"pid {os.getpid()} ")

    class WatchedGpu(FakeGpu):
        def __init__(self):
            seen.append(("open", held(), os.environ.get("CUDA_VISIBLE_DEVICES")))
            super().__init__()

        def __exit__(self, *exc):
            seen.append(("close", held(), None))

    backend = Backend(gpu=WatchedGpu, conv_op=FAKE.conv_op, network=FAKE.network, compile_all=FAKE.compile_all)
    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}], repeats=2, warmup=0)
    m = run_one_job(job, tmp_path / "job.json", backend=backend).measurements[0]
    assert m.status == "ok", m.error
    assert seen == [("open", True, f"GPU-{FakeGpu.uuid}"), ("close", True, None)]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    import fcntl  # let go after the job: another process could take it now
    with open(lock) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_job_opens_nvml_once_for_its_gpu(tmp_path):
    """NVML's opening (~0.03 s on the lent H100's host) happens while the job holds the GPU: once,
    the environment's GPU identity read through the job's own monitor."""
    from convsweep.device.provenance import GpuMonitor

    opened = []

    def counted(*args):
        opened.append(args)
        return GpuMonitor(*args)

    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64, 128]}}], repeats=2, warmup=0)
    ms = run_one_job(job, tmp_path / "job.json", backend=dataclasses.replace(GRID, monitor=counted)).measurements
    assert [m.status for m in ms] == ["ok", "ok"] and len(opened) == 1


# -- the machine, not the code: no result, one line, the job fails ---------------------------------
def no_gpu_here():
    raise no_gpu("cuInit: CUDA_ERROR_NO_DEVICE")


NO_GPU = dataclasses.replace(FAKE, gpu=no_gpu_here, devices=no_gpu_here)


class CompiledBuilds:
    def __init__(self, builds):
        self.builds = builds

    def wait(self):
        return self.builds


@contextlib.contextmanager
def block_1024_does_not_compile(requests, arch):
    """compile_all's answer where naive with BLOCK=1024 fails NVRTC (the fake ops need no other build)."""
    yield CompiledBuilds({r: CompileError("kernels/naive.cu:12: error: BLOCK too large (variant 'naive', NVRTC)")
                          for r in requests if dict(r.macros).get("BLOCK") == 1024})


def test_a_machine_without_a_gpu_fails_the_job_and_leaves_no_result(tmp_path):
    out = tmp_path / "grid.json"
    out.write_text("{}")  # an earlier run's file would pass this run off as measured
    with pytest.raises(MachineError) as caught:
        run_one_job(grid_job(), out, backend=NO_GPU)
    assert str(caught.value) == "no NVIDIA GPU or driver on this machine (cuInit: CUDA_ERROR_NO_DEVICE)"
    assert not out.exists() and not list(tmp_path.glob("grid.partial/*.json"))


def test_a_kernel_that_does_not_compile_is_a_result_even_where_no_gpu_opens(tmp_path):
    """The builds run on the CPU: a compile error is the kernel's result on any machine. It is kept to
    resume while the other settings wait for a GPU; a job of such settings only needs none at all."""
    out = tmp_path / "grid.json"
    backend = dataclasses.replace(NO_GPU, compile_all=block_1024_does_not_compile)
    with pytest.raises(MachineError):
        run_one_job(grid_job(), out, backend=backend)
    kept = [Measurement.from_json(json.loads(p.read_text())["measurement"])
            for p in (tmp_path / "grid.partial").glob("*.json")]
    assert [(m.params["conv1"]["BLOCK"], m.status) for m in kept] == [(1024, "failed")]
    assert kept[0].error.startswith("kernels/naive.cu:12: error: BLOCK too large") and not out.exists()

    result = run_one_job(grid_job(), out, backend=GRID)  # a machine with a GPU: the other four
    assert result.settings == SettingCounts(valid=5, measured=4, resumed=1) and GridNetwork.built == [64, 128, 256, 512]

    alone = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [1024]}}])
    ms = run_one_job(alone, tmp_path / "alone.json", backend=backend).measurements
    assert [m.status for m in ms] == ["failed"] and "BLOCK too large" in ms[0].error


@pytest.fixture
def no_nsys(monkeypatch):
    """A machine without nsys: none on PATH, and a $NSYS naming nothing."""
    path = os.environ.get("PATH", "").split(os.pathsep)
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in path if d and not os.path.exists(os.path.join(d, "nsys"))))
    monkeypatch.setenv("NSYS", "/nonexistent/nsys")


def test_profiler_nsys_requires_nsys_where_a_gpu_is_timed(tmp_path, no_nsys):
    out = tmp_path / "grid.json"
    with pytest.raises(MachineError, match=r"^profiler: nsys asked for but nsys is not on PATH or \$NSYS$"):
        run_one_job(grid_job(profiler="nsys"), out, backend=FAKE)
    assert not out.exists() and not (tmp_path / "grid.partial").exists()  # refused before anything ran


def test_without_a_gpu_the_job_says_so_before_it_asks_for_nsys(tmp_path, no_nsys):
    """A newcomer on a machine without a GPU is told what stops every GPU job, not that nsys is missing."""
    out = tmp_path / "grid.json"
    with pytest.raises(MachineError, match=r"^no NVIDIA GPU or driver on this machine \(cuInit: CUDA_ERROR_NO_DEVICE\)$"):
        run_one_job(grid_job(profiler="nsys"), out, backend=NO_GPU)
    assert not out.exists()


def test_profiler_auto_times_with_events_where_nsys_is_missing_and_says_so(tmp_path, no_nsys):
    ms = run_one_job(grid_job(profiler="auto"), tmp_path / "grid.json", backend=FAKE).measurements
    assert {(m.status, m.profiler, m.profiler_note) for m in ms} == \
        {("ok", "events", "nsys not found: timed with CUDA events")}


def test_a_cpu_job_needs_neither_nsys_nor_a_gpu(tmp_path, no_nsys):
    m = run_job(spec(profiler="nsys"), tmp_path / "r.json", backend=NO_GPU)
    assert m.status == "ok" and m.profiler == "cpu" and "profiler_note" not in m.to_json()


def test_an_unknown_profiler_is_the_specs_error_not_the_machines(tmp_path):
    with pytest.raises(ConvsweepError, match=r"^profiler: expected one of nsys, auto, events, got 'nsight'$") as caught:
        run_one_job(grid_job(profiler="nsight"), tmp_path / "grid.json", backend=FAKE)
    assert not isinstance(caught.value, MachineError)


def run_job_command(job: JobSpec, out) -> subprocess.CompletedProcess:
    """`convsweep run-job` as the workflow runs it."""
    return subprocess.run([sys.executable, "-m", "convsweep.app.cli", "run-job", "--spec",
                           json.dumps({**job.to_dict(), "sweep": job.sweep}), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)


def test_run_job_on_a_machine_that_cannot_run_it_prints_one_line_exits_non_zero_and_writes_nothing(tmp_path, no_nsys):
    """The workflow's contract: exit status non-zero, one line `convsweep: <why>` on stderr, no file."""
    out = tmp_path / "grid.json"
    done = run_job_command(grid_job(profiler="nsys"), out)
    assert done.returncode == 2
    if gpu_available()[0]:
        assert done.stderr == "convsweep: profiler: nsys asked for but nsys is not on PATH or $NSYS\n"
    else:  # no GPU is said first: nsys alone would not let this machine run the job
        assert re.fullmatch(r"convsweep: no NVIDIA GPU or driver on this machine \(.+\)\n", done.stderr), done.stderr
    assert not out.exists()


@pytest.mark.skipif(gpu_available()[0], reason="checks a machine without a GPU")
def test_run_job_without_a_gpu_prints_convsweeps_own_line(tmp_path):
    out = tmp_path / "grid.json"
    done = run_job_command(grid_job(), out)
    assert done.returncode == 2 and not out.exists()
    assert re.fullmatch(r"convsweep: no NVIDIA GPU or driver on this machine \(.+\)\n", done.stderr), done.stderr


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_or_read_only_disk_is_the_machines_failure_naming_the_file(tmp_path, code):
    with pytest.raises(MachineError, match=rf"^cannot write {re.escape(str(tmp_path))}/r\.json: {os.strerror(code)}$"):
        with writing(tmp_path / "r.json"):
            raise OSError(code, os.strerror(code))
    with pytest.raises(PermissionError):  # not the disk's state: stays what it is
        with writing(tmp_path / "r.json"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of its own, to fill (mounting one needs root: skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                                 text=True)
    except OSError as e:
        pytest.skip(f"cannot mount a tmpfs to fill: {e}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def fill(path) -> None:
    """Write `path` until the disk has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(65536))
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_full_disk_stops_the_job_with_one_line_and_keeps_the_settings_it_finished(small_disk):
    out = small_disk / "grid.json"

    class FillsTheDisk(GridNetwork):
        def __init__(self, gpu, network, weights, plan, lanes, capacity):
            if plan.params["conv1"]["BLOCK"] == 256:
                fill(small_disk / "filler")
            super().__init__(gpu, network, weights, plan, lanes, capacity)

    with pytest.raises(MachineError, match=rf"^cannot write {re.escape(str(small_disk))}/grid\.partial/\w+\.json: "
                                           r"No space left on device$"):
        run_one_job(grid_job(), out, backend=dataclasses.replace(GRID, network=FillsTheDisk))
    assert not out.exists() and not list(small_disk.rglob(".*.tmp"))  # no half-written file
    assert len(list((small_disk / "grid.partial").glob("*.json"))) == 2  # 64 and 128, to resume

    (small_disk / "filler").unlink()
    GridNetwork.built = []
    result = run_one_job(grid_job(), out, backend=GRID)
    assert result.settings == SettingCounts(valid=5, measured=3, resumed=2) and GridNetwork.built == [256, 512, 1024]
