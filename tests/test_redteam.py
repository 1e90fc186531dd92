"""The red team: kernels and networks that cheat, each held to the verdict convsweep.integrity must give.

They live in tests/redteam/, never in the shipped registry: the kernels register through
CONVSWEEP_VARIANTS=tests/redteam/variants.yaml, the networks go in through runner.Backend(network=...).
Each runs LeNet-86 at batch 1000 (events, one stream, 5 timed passes after 1 warm-up) on one conv
layer, naive on the other.

What each cheats -> what catches it -> the verdict:
- redteam_compute_once: computes on its first launch (the seed pass), then returns at once -> outputs
  poisoned before each timed pass, every timed pass checked -> incorrect, timed pass 0.
- redteam_memo_pointer: copies the output it kept when x's pointer repeats -> fresh inputs in the same
  buffer, every timed pass checked -> incorrect.
- redteam_memo_hash: copies the output it kept when an image's hash repeats, so it is honest on fresh
  inputs -> the caching test (passes over one round repeated against passes over fresh ones) -> suspect.
- redteam_partial: never writes every 97th output element -> +huge poison through ReLU and max-pool,
  checked logits -> incorrect.
- redteam_approx: 4 images in 1000 off by 3e-5 (the logits by 1.6-1.9e-5 against fp32's 1e-5) -> every
  timed pass's logits against float64 -> incorrect.
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

from convsweep.config import RunSpec
from convsweep.paths import ROOT
from convsweep.variants import VARIANTS_ENV, ConvShape, load_registry

# Every verdict here rests on timed passes (the caching test and the probe most of all): the GPU tests
# run alone, no other worker's kernels beside them (gpu_turns.py); the CPU ones are not held.
pytestmark = pytest.mark.alone

REDTEAM_DIR = ROOT / "tests" / "redteam"
REDTEAM_REGISTRY = REDTEAM_DIR / "variants.yaml"
# Each red-team kernel and the layer it runs on. conv2 where the cheat keys on the input's address
# (a lane buffer of the runner: the same every pass) or where the most time is to be gained.
KERNEL_LAYER = {"redteam_compute_once": "conv2", "redteam_memo_pointer": "conv2", "redteam_memo_hash": "conv2",
                "redteam_partial": "conv1", "redteam_approx": "conv2"}
WRONG_KERNELS = [name for name in KERNEL_LAYER if name != "redteam_memo_hash"]  # every pass of these is checkable
LENET_SHAPES = [ConvShape(B=1000, C=1, M=4, H=86, W=86, K=7), ConvShape(B=1000, C=4, M=16, H=40, W=40, K=7)]


@pytest.fixture
def redteam(monkeypatch):
    """The red-team registry joined to the shipped one, for this test (and a job's children)."""
    monkeypatch.setenv(VARIANTS_ENV, str(REDTEAM_REGISTRY))


def spec(cheat: str | None = None) -> RunSpec:
    """LeNet-86 at batch 1000, events, one stream, 5 timed passes after 1 warm-up: naive on every
    conv layer but the one `cheat` (a red-team kernel) runs on."""
    variants = {"conv1": "naive", "conv2": "naive"}
    if cheat is not None:
        variants[KERNEL_LAYER[cheat]] = cheat
    return RunSpec(experiment="redteam", network="networks/lenet86.yaml", dataset="mnist5k", variants=variants,
                   params={"conv1": {}, "conv2": {}}, batch=1000, streams=1, host_memory="pageable", repeats=5,
                   warmup=1, profiler="events")


def measured(run: RunSpec, network=None):
    """`run` measured in this process, with `network` (a GpuNetwork class) building the network."""
    from convsweep.measure import measure
    from convsweep.runner import Backend

    return measure(run, backend=Backend() if network is None else Backend(network=network))


# -- on the CPU: the red team is registered, compiles, and is never shipped ------------------------
def test_the_red_team_joins_the_registry_through_the_environment(redteam):
    registry = load_registry()
    names = {name for name in registry if name.startswith("redteam_")}
    assert names == set(KERNEL_LAYER)
    assert {"naive", "reference"} <= set(registry)  # the shipped ones stay
    for name in names:
        variant = registry[name]
        assert variant.precision == "fp32" and variant.source.parent == REDTEAM_DIR, name
        for shape in LENET_SHAPES:
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
        from convsweep.compile import compile_variant, nvrtc_version

        nvrtc_version()
    except Exception as e:  # no cuda-bindings or no NVRTC library: nothing to compile with
        pytest.skip(f"NVRTC is not importable here ({type(e).__name__}: {e})")
    variant = load_registry()[name]
    build = compile_variant(variant, variant.defaults(), arch)
    assert build.cubin[:4] == b"\x7fELF"
    assert set(variant.kernel_names) <= {k.name for k in build.kernels}


def test_the_host_level_cheats_are_networks_a_backend_takes():
    from convsweep.runner import Backend, GpuNetwork
    from redteam.networks import PersistingL2Network, SideStreamNetwork

    for network in (SideStreamNetwork, PersistingL2Network, functools.partial(PersistingL2Network, once=True)):
        assert Backend(network=network).network is network
    assert issubclass(SideStreamNetwork, GpuNetwork) and issubclass(PersistingL2Network, GpuNetwork)


# -- on the GPU: each cheat gets its verdict ---------------------------------------------------------
def persisting_l2_supported() -> bool:
    """Whether the GPU lets a context set L2 aside for persisting lines (not under MIG, for one)."""
    from cuda.bindings import driver

    from convsweep.gpu import _check

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
def test_a_kernel_that_memoizes_by_value_fails_the_caching_test(redteam):
    m = measured(spec("redteam_memo_hash"))
    assert m.status == "suspect", (m.status, m.error)
    assert m.integrity.failed_pass is None  # fresh inputs make it honest: every pass is right
    assert any("caching test" in reason for reason in m.integrity.reasons), m.integrity.reasons


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
