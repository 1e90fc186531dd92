"""The float64 truth and the rounds on a real GPU (skipped with the reason elsewhere): kernels/truth.cu held to
numpy's float64 reference for every network in networks/ and every input format, the device comparison to the
host's, rounds made again bit for bit from their seed, and a job past the dataset's size with every pass fresh.
tests/test_truth.py and tests/test_rounds.py hold the same kernels to the same answers on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from convsweep.model.checks import RowStats, normwise_error
from convsweep.sweep.config import RunSpec
from convsweep.inputs.formats import FORMATS
from convsweep.inputs.batch import load_batch
from convsweep.measure.settings import measure
from convsweep.model.network import load_network, random_weights, reference_forward
from convsweep.base.paths import ROOT
from convsweep.device.rounds import FRESH_SHARE, RoundMaker
from convsweep.device.truth import Truth, TruthKernels

pytestmark = pytest.mark.gpu

TOLERANCE = 1e-12


@pytest.fixture(scope="module")
def gpu():
    from convsweep.device.gpu import Gpu

    with Gpu() as g:
        yield g


@pytest.fixture(scope="module")
def kernels(gpu):
    return TruthKernels(gpu, gpu.arch)


def forward(kernels, network, weights, images: np.ndarray) -> np.ndarray:
    gpu = kernels.gpu
    stream = gpu.stream()
    truth = Truth(kernels, network, weights, stream)
    x = gpu.to_device(np.ascontiguousarray(images), stream)
    out = gpu.alloc((len(images), *truth.out_shape), np.float64)
    truth.forward(x, len(images), out, stream)
    host = np.empty(out.shape, np.float64)
    gpu.download(out, host, stream)
    stream.sync()
    return host


@pytest.mark.parametrize("input_format", list(FORMATS))
def test_lenet86_in_every_input_format_matches_numpy_on_the_device(kernels, input_format):
    batch = load_batch(load_network(ROOT / "networks/lenet86.yaml"), "mnist5k", 37, input_format)
    got = forward(kernels, batch.network, batch.weights, batch.images)
    assert normwise_error(got, reference_forward(batch.network, batch.weights, batch.images)) <= TOLERANCE


def test_the_fp64_workload_matches_numpy_on_the_device(kernels):
    network = load_network(ROOT / "networks/fp64_stride5.yaml")
    x = np.random.default_rng(1).random((9, *network.input_shape))
    weights = random_weights(network)
    assert normwise_error(forward(kernels, network, weights, x), reference_forward(network, weights, x)) <= TOLERANCE


def test_the_wide_conv256_workload_matches_numpy_on_the_device(kernels):
    network = load_network(ROOT / "networks/conv256.yaml")
    x = np.random.default_rng(2).random((1, *network.input_shape), dtype=np.float32)
    weights = random_weights(network)
    assert normwise_error(forward(kernels, network, weights, x), reference_forward(network, weights, x)) <= TOLERANCE


def test_the_device_comparison_gives_the_hosts_row_statistics(kernels):
    gpu = kernels.gpu
    stream = gpu.stream()
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((300, 5000))
    y = (ref + rng.standard_normal(ref.shape) * 1e-3).astype(np.float32)
    y[7, 11], y[9, 0] = np.nan, -np.inf
    truth = Truth(kernels, load_network(ROOT / "networks/lenet86.yaml"), {}, stream)
    got = truth.compare(gpu.to_device(y, stream), gpu.to_device(ref, stream), len(y), stream)
    want = RowStats.of(y, ref)
    for field in ("diff", "scale", "predicted", "expected", "bad"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field


def test_a_round_is_made_again_bit_for_bit_from_its_seed(kernels):
    gpu = kernels.gpu
    stream = gpu.stream()
    batch = load_batch(load_network(ROOT / "networks/lenet86.yaml"), "mnist5k", 1000)
    made = []
    for seed in (5, 5, 6):
        maker = RoundMaker(kernels, batch.shipped, 1000, seed, stream)
        out = gpu.alloc((1000, *batch.shipped.shape[1:]), batch.shipped.dtype)
        maker.make(3, out, stream)
        host = np.empty(out.shape, out.dtype)
        gpu.download(out, host, stream)
        stream.sync()
        made.append(host)
    assert np.array_equal(made[0], made[1]) and not np.array_equal(made[0], made[2])
    assert np.mean(made[0] == 0) > 0.5  # digits on a blank background


@pytest.mark.parametrize("input_format", ["fp32", "u8-source"])
def test_a_job_past_the_datasets_size_times_every_pass_on_a_fresh_round(input_format):
    run = RunSpec(experiment="gpu-test", network="networks/lenet86.yaml", dataset="mnist5k",
                  variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}}, batch=10001,
                  streams=1, host_memory="pinned", repeats=5, warmup=1, profiler="events", input_format=input_format)
    m = measure(run)
    assert m.status == "ok", m.error
    found = m.integrity
    assert found.fresh_passes == found.checked_passes == 5 and found.freshness["share"] >= FRESH_SHARE
    assert found.caching["rounds"] == 3 and not found.reasons
    assert m.accuracy == pytest.approx(0.9932, abs=0.002) and found.fresh_accuracy > 0.9
