"""The red team: kernels and networks that cheat, each held to the verdict convsweep.measure.integrity must give.

They live in tests/redteam/, never in the shipped registry: the kernels register through
CONVSWEEP_VARIANTS=tests/redteam/variants.yaml, the networks go in through runner.Backend(network=...).
Each runs LeNet-86 (events, one stream, 5 timed passes after 1 warm-up) on one conv layer, naive on the
other, at batch 1000 unless it says otherwise.

What each cheats -> what catches it -> the verdict:
- redteam_compute_once: computes on its first launch (the seed pass), then returns at once -> outputs
  poisoned before each timed pass, every timed pass checked -> incorrect, timed pass 0.
- redteam_memo_pointer: copies the output it kept in its workspace when x's pointer repeats -> the workspace
  poisoned before every pass (NaN bytes: the key never matches) -> ok, and no faster than naive.
- redteam_memo_hash: copies the output it kept in its workspace when an image's hash repeats -> the same poison,
  in every checks mode and between the caching test's sightings -> ok, and no faster than naive.
- redteam_memo_third: serves an image from its third sighting on (module-scope memory) -> the caching test's
  three sightings of each round -> suspect, "sighting 3".
- redteam_memo_layer: conv1 alone memoized, the rest computed -> the caching test -> suspect, "sighting 2".
- redteam_memo_corner_blind: a memo whose key leaves out the corners, on u8-source -> rounds perturb the whole
  digit -> ok with fast checks, and no faster than naive.
- redteam_memo_batch: the whole batch memoized in the workspace -> fresh rounds, the workspace poisoned -> ok, no
  faster than naive.
- redteam_dedup: at batch 10000, computes each of mnist5k's images once and copies its repeat -> no image repeats
  in a fresh round -> ok, no faster than naive.
- redteam_round0: recognises the seeds' batch by its first image at batch 10000 -> no timed pass runs on round 0
  -> ok, no faster than naive, and its build's findings name its module-scope write.
- redteam_partial: never writes every 97th output element -> +huge poison through ReLU and max-pool,
  checked logits -> incorrect.
- redteam_approx: 4 images in 1000 off by 3e-5 (the logits by 1.6-1.9e-5 against fp32's 1e-5) -> every
  timed pass's logits against float64 -> incorrect.
- redteam_low_mantissa: weights cut to a few mantissa bits, fp16-class -> caught where the cut leaves the fp16
  tolerance; the widths it lets through are measured (docs/guarantees.md).
- redteam_out_of_bounds: a bug, not a cheat: writes past the end of its output -> `sanitize: true`,
  compute-sanitizer's memcheck -> incorrect.
- redteam_hang: a bug: its first thread never ends -> the job's deadline (`deadline_s`) kills the worker and its
  CUDA context -> timeout, and the next job has the GPU.
- SideStreamNetwork: more convs after each layer on a stream the pass never joins -> the probe for work
  still running after each pass -> suspect.
- PersistingL2Network: a persisting-L2 set-aside and a window over the input, at every pass -> the device
  state read again after timing -> suspect.
- PersistingL2Network(once=True): the set-aside once, at start-up -> read and reset before timing -> ok,
  with what was found in integrity.device_state.
"""
from __future__ import annotations

import functools

import pytest

from convsweep.sweep.config import RunSpec
from convsweep.base.paths import ROOT
from convsweep.model.variants import VARIANTS_ENV, ConvShape, load_registry

# Every verdict here rests on timed passes (the caching test and the probe most of all): the GPU tests
# run alone, no other worker's kernels beside them (gpu_turns.py); the CPU ones are not held.
pytestmark = pytest.mark.alone

REDTEAM_DIR = ROOT / "tests" / "redteam"
REDTEAM_REGISTRY = REDTEAM_DIR / "variants.yaml"
# Each red-team kernel and the layer it runs on. conv2 where the cheat keys on the input's address
# (a lane buffer of the runner: the same every pass) or where the most time is to be gained.
KERNEL_LAYER = {"redteam_compute_once": "conv2", "redteam_memo_pointer": "conv2", "redteam_memo_hash": "conv2",
                "redteam_partial": "conv1", "redteam_approx": "conv2", "redteam_memo_third": "conv2",
                "redteam_memo_layer": "conv1", "redteam_memo_corner_blind": "conv1", "redteam_memo_batch": "conv1",
                "redteam_dedup": "conv2", "redteam_round0": "conv2", "redteam_low_mantissa": "conv2",
                "redteam_out_of_bounds": "conv2", "redteam_hang": "conv1"}
WRONG_KERNELS = ["redteam_compute_once", "redteam_partial", "redteam_approx"]
WORKSPACE_MEMOS = ["redteam_memo_hash", "redteam_memo_batch", "redteam_memo_pointer"]
LENET_SHAPES = {"conv1": ConvShape(B=1000, C=1, M=4, H=86, W=86, K=7),
                "conv2": ConvShape(B=1000, C=4, M=16, H=40, W=40, K=7)}
HONEST_SHARE = 0.9  # a cheat that gained nothing times at least this share of naive's op time (it hashes too)


@pytest.fixture
def redteam(monkeypatch):
    """The red-team registry joined to the shipped one, for this test (and a job's children)."""
    monkeypatch.setenv(VARIANTS_ENV, str(REDTEAM_REGISTRY))


def spec(cheat: str | None = None, layer: str | None = None, **over) -> RunSpec:
    """LeNet-86 at batch 1000, events, one stream, 5 timed passes after 1 warm-up: naive on every
    conv layer but the one `cheat` (a red-team kernel) runs on; `over` changes the rest."""
    variants = {"conv1": "naive", "conv2": "naive"}
    if cheat is not None:
        variants[layer or KERNEL_LAYER[cheat]] = cheat
    base = dict(experiment="redteam", network="networks/lenet86.yaml", dataset="mnist5k", variants=variants,
                params={"conv1": {}, "conv2": {}}, batch=1000, streams=1, host_memory="pageable", repeats=5,
                warmup=1, profiler="events")
    return RunSpec(**{**base, **over})


def measured(run: RunSpec, network=None):
    """`run` measured in this process, with `network` (a GpuNetwork class) building the network."""
    from convsweep.measure.settings import measure
    from convsweep.measure.runner import Backend

    return measure(run, backend=Backend() if network is None else Backend(network=network))


# -- on the CPU: the red team is registered, compiles, and is never shipped ------------------------
def test_the_red_team_joins_the_registry_through_the_environment(redteam):
    registry = load_registry()
    names = {name for name in registry if name.startswith("redteam_")}
    assert names == set(KERNEL_LAYER)
    assert {"naive", "reference"} <= set(registry)  # the shipped ones stay
    for name in names:
        variant = registry[name]
        assert variant.precision == ("fp16" if name == "redteam_low_mantissa" else "fp32"), name
        assert variant.source.parent == REDTEAM_DIR, name
        shape = LENET_SHAPES[KERNEL_LAYER[name]]
        assert variant.launch_plan(shape, variant.defaults()), name
        if variant.workspace:
            assert variant.workspace_bytes(shape, variant.defaults()) > 0, name


def test_no_red_team_kernel_is_in_the_shipped_registry(monkeypatch):
    monkeypatch.delenv(VARIANTS_ENV, raising=False)
    shipped = load_registry()
    assert not set(KERNEL_LAYER) & set(shipped)
    assert not any(v.source is not None and REDTEAM_DIR in v.source.parents for v in shipped.values())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(KERNEL_LAYER))
def test_every_red_team_kernel_compiles(redteam, name, arch):
    try:
        from convsweep.device.compile import compile_variant, nvrtc_version

        nvrtc_version()
    except Exception as e:  # no cuda-bindings or no NVRTC library: nothing to compile with
        pytest.skip(f"NVRTC is not importable here ({type(e).__name__}: {e})")
    variant = load_registry()[name]
    build = compile_variant(variant, variant.defaults(), arch)
    assert build.cubin[:4] == b"\x7fELF"
    assert set(variant.kernel_names) <= {k.name for k in build.kernels}
    # What each keeps between passes in module-scope memory is on its build's record (convsweep.device.findings).
    module_scope = {"redteam_compute_once", "redteam_memo_third", "redteam_memo_layer", "redteam_memo_corner_blind",
                    "redteam_round0"}
    assert any("global_write" in keys for keys in build.findings.values()) == (name in module_scope), build.findings


def test_the_host_level_cheats_are_networks_a_backend_takes():
    from convsweep.measure.runner import Backend, GpuNetwork
    from redteam.networks import PersistingL2Network, SideStreamNetwork

    for network in (SideStreamNetwork, PersistingL2Network, functools.partial(PersistingL2Network, once=True)):
        assert Backend(network=network).network is network
    assert issubclass(SideStreamNetwork, GpuNetwork) and issubclass(PersistingL2Network, GpuNetwork)


# -- on the GPU: each cheat gets its verdict ---------------------------------------------------------
def persisting_l2_supported() -> bool:
    """Whether the GPU lets a context set L2 aside for persisting lines (not under MIG, for one)."""
    from cuda.bindings import driver

    from convsweep.device.gpu import _check

    _check(driver.cuInit(0), "cuInit")
    device = _check(driver.cuDeviceGet(0), "cuDeviceGet")
    attribute = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
    return _check(driver.cuDeviceGetAttribute(attribute, device), "cuDeviceGetAttribute") > 0


@pytest.mark.gpu
def test_the_honest_control_is_ok_and_every_timed_pass_checked(redteam):
    m = measured(spec())
    assert m.status == "ok", m.error
    assert m.integrity.checked_passes == 5 and m.integrity.failed_pass is None
    assert m.integrity.reasons == []


@pytest.mark.gpu
@pytest.mark.parametrize("cheat", WRONG_KERNELS)
def test_a_kernel_whose_timed_pass_is_wrong_is_incorrect(redteam, cheat):
    m = measured(spec(cheat))
    assert m.status == "incorrect", (m.status, m.error)
    assert m.error.startswith("timed pass "), m.error
    assert m.integrity.failed_pass is not None
    if cheat == "redteam_compute_once":  # the seed pass was its one launch: the first timed pass fails
        assert m.integrity.failed_pass == 0


@pytest.mark.gpu
def test_work_on_a_stream_the_pass_never_joins_is_suspect():
    from redteam.networks import SideStreamNetwork

    m = measured(spec(), SideStreamNetwork)
    assert m.status == "suspect", (m.status, m.error)
    assert any("still running" in reason for reason in m.integrity.reasons), m.integrity.reasons


@pytest.mark.gpu
def test_a_persisting_l2_window_set_at_every_pass_is_suspect():
    from redteam.networks import PersistingL2Network

    if not persisting_l2_supported():
        pytest.skip("this GPU has no persisting L2 to set aside")
    m = measured(spec(), PersistingL2Network)
    assert m.status == "suspect", (m.status, m.error)
    assert any("persisting-L2" in reason for reason in m.integrity.reasons), m.integrity.reasons


@pytest.mark.gpu
def test_a_persisting_l2_set_aside_made_once_is_reset_before_timing():
    from redteam.networks import PersistingL2Network

    if not persisting_l2_supported():
        pytest.skip("this GPU has no persisting L2 to set aside")
    m = measured(spec(), functools.partial(PersistingL2Network, once=True))
    assert m.status == "ok", (m.status, m.error)
    state = m.integrity.device_state
    assert state["reset"] is True and state["persisting_l2_bytes"] > 0, state


# -- memos that fresh rounds leave nothing to serve ---------------------------------------------------------
_naive: dict[tuple, float] = {}


def naive_op_ms(layer: str, **over) -> float:
    """naive's op time of `layer` measured as the cheat it is held to is (same batch, input and checks)."""
    key = (layer, tuple(sorted(over.items())))
    if key not in _naive:
        m = measured(spec(**over))
        assert m.status == "ok", m.error
        _naive[key] = m.timings.op_time_ms[layer]
    return _naive[key]


def gained_nothing(m, cheat: str, **over) -> None:
    """The cheat's timed passes were its own work: ok, and no faster than naive on the same passes."""
    layer = KERNEL_LAYER[cheat]
    assert m.status == "ok", (m.status, m.error)
    assert m.integrity.fresh_passes == m.integrity.checked_passes == 5 and 0 not in m.integrity.rounds
    assert m.timings.op_time_ms[layer] >= HONEST_SHARE * naive_op_ms(layer, **over), \
        (m.timings.op_time_ms[layer], naive_op_ms(layer, **over))


@pytest.mark.gpu
@pytest.mark.parametrize("cheat, sighting", [("redteam_memo_third", 3), ("redteam_memo_layer", 2)])
def test_a_memo_of_any_depth_shows_in_the_caching_test(redteam, cheat, sighting):
    m = measured(spec(cheat))
    assert m.status == "suspect", (m.status, m.error)
    assert m.integrity.failed_pass is None  # fresh rounds make it honest: every timed pass is right
    assert any(r.startswith(f"caching test: sighting {sighting} ") for r in m.integrity.reasons), m.integrity.reasons


@pytest.mark.gpu
@pytest.mark.parametrize("checks", ["full", "fast"])
@pytest.mark.parametrize("cheat", WORKSPACE_MEMOS)
def test_a_workspace_memo_gains_nothing_in_any_checks_mode(redteam, cheat, checks):
    """The workspace is poisoned before every pass (the caching test's sightings too): a memo kept there is never
    found again, so the kernel computes every pass and is as honest as naive, and as slow."""
    over = {"checks": checks}
    layer = "conv1"  # where the tuning sweep once crowned redteam_memo_hash (0.251 ms against naive's 0.684)
    m = measured(spec(cheat, layer, **over))
    assert m.status == "ok", (m.status, m.error)
    assert m.integrity.reasons == [], m.integrity.reasons
    assert m.timings.op_time_ms[layer] >= HONEST_SHARE * naive_op_ms(layer, **over)


@pytest.mark.gpu
def test_a_corner_blind_memo_on_the_stored_digits_gains_nothing(redteam):
    over = {"checks": "fast", "input_format": "u8-source"}
    gained_nothing(measured(spec("redteam_memo_corner_blind", **over)), "redteam_memo_corner_blind", **over)


@pytest.mark.gpu
def test_deduplicating_the_batch_at_10000_gains_nothing(redteam):
    over = {"checks": "fast", "batch": 10000}
    gained_nothing(measured(spec("redteam_dedup", **over)), "redteam_dedup", **over)


@pytest.mark.gpu
def test_recognising_the_seeds_batch_gains_nothing_and_its_module_scope_write_is_on_record(redteam):
    over = {"checks": "fast", "batch": 10000}
    m = measured(spec("redteam_round0", warmup=3, **over))  # round 0 three times before timing: it recognises it
    gained_nothing(m, "redteam_round0", **over)
    (build,) = [b for b in m.builds if b["variant"] == "redteam_round0"]
    assert build["findings"]["round0_print_of"] == ["global_write"]


@pytest.mark.gpu
def test_weights_cut_far_below_half_precision_are_caught_and_what_passes_is_measured(redteam, capsys):
    """The fp16 class's tolerance (1e-2 normwise, accuracy within 0.5 points) against weights cut to a few
    mantissa bits on both conv layers: printed as a table (docs/guarantees.md, "What a number does not guarantee")."""
    rows = []
    for bits in (0, 1, 2, 3, 4, 6, 10):
        run = spec("redteam_low_mantissa", checks="fast", variants={"conv1": "redteam_low_mantissa",
                                                                    "conv2": "redteam_low_mantissa"},
                   params={"conv1": {"MANTISSA_BITS": bits}, "conv2": {"MANTISSA_BITS": bits}})
        m = measured(run)
        rows.append((bits, m.status, m.max_rel_err, m.accuracy, m.integrity.fresh_accuracy, m.error))
    with capsys.disabled():
        print("\nmantissa bits | status | max_rel_err (round 0) | accuracy (round 0) | accuracy (timed rounds)")
        for bits, status, err, acc, fresh, _ in rows:
            print(f"{bits:13d} | {status:9s} | {err:.3g} | {acc:.4f} | {fresh if fresh is None else round(fresh, 4)}")
    verdicts = {bits: status for bits, status, *_ in rows}
    assert verdicts[0] == "incorrect" and verdicts[10] == "ok", rows


@pytest.mark.gpu
def test_sanitize_finds_a_write_out_of_bounds_and_passes_an_honest_kernel(redteam):
    from convsweep.sweep.sanitize import find_sanitizer

    if find_sanitizer() is None:
        pytest.skip("compute-sanitizer is not installed here")
    honest = measured(spec(batch=100, sanitize=True))
    assert honest.status == "ok", honest.error
    assert {tool: report["errors"] for tool, report in honest.integrity.sanitizer.items()} == {"memcheck": 0,
                                                                                              "initcheck": 0}
    m = measured(spec("redteam_out_of_bounds", batch=100, sanitize=True))
    assert m.status == "incorrect" and m.error.startswith("compute-sanitizer memcheck: "), (m.status, m.error)


@pytest.mark.gpu
def test_a_kernel_that_never_ends_costs_its_deadline_and_the_next_job_has_the_gpu(redteam, tmp_path):
    import json
    import subprocess
    import sys
    import time

    from convsweep.base.strict_json import read_json
    from convsweep.measure.record import ResultFile
    from convsweep.sweep.config import JobSpec

    job = JobSpec.for_run(spec("redteam_hang", batch=100, deadline_s=5.0),
                          sweep={"experiment": "redteam", "config_hash": "h", "config_path": "x.yaml"})
    spec_file, out = tmp_path / "job.json", tmp_path / "r.json"
    spec_file.write_text(json.dumps({**job.to_dict(), "sweep": job.sweep}))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "convsweep", "run-job", "--spec-file", str(spec_file), "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    print(f"\nthe hanging job: {took:.1f} s, deadline 5 s; its log:\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stderr
    (m,) = ResultFile.from_json(read_json(out)).measurements
    assert m.status == "timeout" and "5 s deadline" in m.error, (m.status, m.error)
    assert took < 5 + 60, took  # its deadline, and the start of two workers (compile cached the second time)
    t = time.monotonic()
    after = measured(spec(batch=100))  # the GPU and its lock are free: the honest control runs at once
    assert after.status == "ok", after.error
    print(f"the next job: {time.monotonic() - t:.1f} s")


def test_the_red_team_sweep_plans_every_kernel_beside_naive(redteam):
    """tests/redteam/sweep.yaml, which the device sitting runs to hold `query best` and `winners` to the red team."""
    from convsweep.sweep.config import expand_config, load_config

    jobs = expand_config(load_config(REDTEAM_DIR / "sweep.yaml"), "tests/redteam/sweep.yaml")
    swept = {name for job in jobs for name in job.variants.values()}
    assert {"naive", "restrict_unroll", "redteam_memo_third", "redteam_memo_layer", "redteam_dedup", "redteam_round0"} <= swept
    assert {job.checks for job in jobs} == {"fast", "full"} and {job.batch for job in jobs} == {1000, 10000}
