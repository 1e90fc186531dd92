"""The float64 truth (convsweep.device.truth, kernels/truth.cu) on the CPU: its kernels built for the host
(tests/host_kernels.py) and run on the fake GPU's memory, held to numpy's float64 reference to 1e-12
normwise for every layer kind, every network in networks/ (small stand-ins for the large one) and every
input format; and the device comparison held to the host's, NaN, ties and parts included."""
from __future__ import annotations

import math

import numpy as np
import pytest

from convsweep.device import truth as truth_module
from convsweep.model.checks import RowStats, normwise_error
from convsweep.inputs.formats import FORMATS
from convsweep.inputs.batch import load_batch
from convsweep.model.layers import LAYER_KINDS
from convsweep.model.network import load_network, random_weights, reference_forward
from convsweep.device.truth import Truth, TruthKernels, check_against_host, host_sample

from fake_gpu import FakeGpu, FakeStream
from host_kernels import compiler, host_library

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++) to build kernels/truth.cu for the host")

TOLERANCE = 1e-12


@pytest.fixture(scope="module")
def kernels():
    return TruthKernels(FakeGpu(), "sm_90")


def forward(kernels, network, weights, images: np.ndarray) -> np.ndarray:
    """The truth's forward of `images` (shipped) on the fake GPU, as a host array."""
    gpu, stream = kernels.gpu, FakeStream()
    truth = Truth(kernels, network, weights, stream)
    x = gpu.to_device(np.ascontiguousarray(images), stream)
    out = gpu.alloc((len(images), *truth.out_shape), np.float64)
    truth.forward(x, len(images), out, stream)
    return gpu.read(out).copy()


def tiny_network(tmp_path, text: str):
    path = tmp_path / "net.yaml"
    path.write_text(text)
    return load_network(path)


def test_every_layer_kind_has_a_float64_kernel_in_the_truth():
    names = set(host_library(truth_module.TRUTH_SOURCE))
    for kind in LAYER_KINDS.values():
        assert callable(kind.truth)
    convs = {f"conv2d_f64_{g}x2_k{k}" for g in (1, 2, 4, 8, 16) for k in (0, 5, 7)}
    assert convs | {"relu_f64", "maxpool_f64", "dense_f64", "upsample_u8_f64", "convert_u8_f64", "convert_f16_f64",
                    "convert_f32_f64", "convert_f64_f64"} <= names


@pytest.mark.parametrize("input_format", list(FORMATS))
def test_lenet86_in_every_input_format_matches_numpy(kernels, input_format):
    batch = load_batch(load_network("networks/lenet86.yaml"), "mnist5k", 5, input_format)
    got = forward(kernels, batch.network, batch.weights, batch.images)
    expected = reference_forward(batch.network, batch.weights, batch.images, dtype=np.float64)
    assert normwise_error(got, expected) <= TOLERANCE


def test_the_fp64_workload_matches_numpy(kernels):
    network = load_network("networks/fp64_stride5.yaml")
    x = np.random.default_rng(1).random((3, *network.input_shape))
    weights = random_weights(network)
    assert normwise_error(forward(kernels, network, weights, x), reference_forward(network, weights, x)) <= TOLERANCE


@pytest.mark.parametrize("channels, out_channels, kernel, stride", [(3, 8, 5, 1), (2, 10, 3, 2), (1, 1, 1, 1),
                                                                     (5, 12, 4, 3), (4, 16, 7, 1)])
def test_conv_relu_pool_dense_at_odd_shapes_match_numpy(kernels, tmp_path, channels, out_channels, kernel, stride):
    """conv256's shape of network (conv, relu, max-pool) at sizes a CPU can run, with a dense layer after it,
    every channel grouping of conv2d_f64 (16, 8, 4, 2, 1), its kernel sizes unrolled (5, 7) and not (3, 4, 1), and
    strides."""
    network = tiny_network(tmp_path, f"""
name: tiny
input: [{channels}, 19, 17]
dtype: float32
weights: random
layers:
  - {{name: conv1, type: conv2d, out_channels: {out_channels}, kernel: {kernel}, stride: {stride}}}
  - {{name: relu1, type: relu}}
  - {{name: pool1, type: maxpool2d, size: 2}}
  - {{name: flatten, type: flatten}}
  - {{name: fc1, type: dense, out_features: 7}}
""")
    x = np.random.default_rng(2).standard_normal((4, *network.input_shape)).astype(np.float32)
    weights = random_weights(network)
    assert normwise_error(forward(kernels, network, weights, x), reference_forward(network, weights, x)) <= TOLERANCE


def test_a_network_ending_in_a_conv_relu_pool_gives_its_maps(kernels, tmp_path):
    network = tiny_network(tmp_path, """
name: conv-like
input: [6, 16, 16]
dtype: float32
weights: random
layers:
  - {name: conv1, type: conv2d, out_channels: 8, kernel: 5}
  - {name: relu1, type: relu}
  - {name: pool1, type: maxpool2d, size: 2}
  - {name: relu2, type: relu}
""")
    x = np.random.default_rng(3).random((2, *network.input_shape), dtype=np.float32)
    weights = random_weights(network)
    got = forward(kernels, network, weights, x)
    assert got.shape == (2, 8, 6, 6)
    assert normwise_error(got, reference_forward(network, weights, x)) <= TOLERANCE


def test_a_batch_larger_than_a_chunk_runs_in_chunks_with_the_same_answer(kernels, monkeypatch):
    batch = load_batch(load_network("networks/lenet86.yaml"), "mnist5k", 7)
    whole = forward(kernels, batch.network, batch.weights, batch.images)
    monkeypatch.setattr(truth_module, "CHUNK_BYTES", 3 * 4 * 80 * 80 * 8)  # three images a chunk
    chunked = Truth(kernels, batch.network, batch.weights, FakeStream())
    assert chunked.chunk == 3
    assert np.array_equal(forward(kernels, batch.network, batch.weights, batch.images), whole)


def test_kept_layers_are_the_numpy_layers_outputs(kernels):
    from convsweep.model.network import reference_layer

    batch = load_batch(load_network("networks/lenet86.yaml"), "mnist5k", 3)
    gpu, stream = kernels.gpu, FakeStream()
    truth = Truth(kernels, batch.network, batch.weights, stream)
    x = gpu.to_device(batch.images, stream)
    keep = {"relu1": gpu.alloc((3, 4, 80, 80), np.float64), "conv2": gpu.alloc((3, 16, 34, 34), np.float64)}
    out = gpu.alloc((3, 10), np.float64)
    truth.forward(x, 3, out, stream, keep)
    h, weights = batch.images.astype(np.float64), {k: v.astype(np.float64) for k, v in batch.weights.items()}
    for layer in batch.network.layers:
        h = reference_layer(layer, weights, h)
        if layer.name in keep:
            assert normwise_error(gpu.read(keep[layer.name]), h) <= TOLERANCE, layer.name


# -- the comparison on the device -------------------------------------------------------------------------
@pytest.mark.parametrize("per_image", [10, 3 * truth_module.PART_ELEMENTS + 5])
def test_the_device_comparison_gives_the_hosts_row_statistics(kernels, per_image):
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((6, per_image))
    y = (ref + rng.standard_normal(ref.shape) * 1e-4).astype(np.float32)
    y[2, 3] = np.nan
    y[4, 1] = np.inf
    y[5, :] = 0.0  # ties: the first index wins, as numpy's argmax
    ref[1, [2, 7]] = ref[1].max() + 1.0
    gpu, stream = kernels.gpu, FakeStream()
    truth = Truth(kernels, load_network("networks/lenet86.yaml"), {}, stream)
    got = truth.compare(gpu.to_device(y, stream), gpu.to_device(ref, stream), len(y), stream)
    want = RowStats.of(y, ref)
    for field in ("diff", "scale", "predicted", "expected", "bad"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert got.bad.tolist() == [0, 0, 1, 0, 1, 0] and math.isnan(got.error)


def test_the_host_check_of_the_truth_refuses_a_difference():
    a = np.random.default_rng(5).standard_normal((4, 10))
    assert check_against_host(a, a.copy()) == 0.0
    with pytest.raises(Exception, match="differs from the host's"):
        check_against_host(a * (1 + 1e-9), a)
    assert host_sample(10000, 1e7).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9992, 9993, 9994, 9995, 9996, 9997, 9998, 9999]
    assert host_sample(4, 2e11).tolist() == [0, 3]  # a huge image: the first and the last alone


def test_nvrtc_builds_the_truth_for_each_gpu_generation():
    from convsweep.device.compile import compile_source, nvrtc_version

    try:
        nvrtc_version()
    except Exception as e:  # no NVRTC library here: nothing to compile with
        pytest.skip(f"NVRTC is not importable here ({type(e).__name__}: {e})")
    for arch in ("sm_80", "sm_90a"):
        build = compile_source(truth_module.TRUTH_SOURCE, "truth", {}, arch)
        assert build.cubin[:4] == b"\x7fELF"
        assert not any(k.spill_store_bytes for k in build.kernels), arch
