import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from convsweep.inputs.data import load_dataset
from convsweep.base.errors import ConfigError, DataError, ShapeError
from convsweep.model.network import (Network, load_network, load_weights, reference_forward, reference_forward_parallel,
                               reference_layer, weight_shapes)
from convsweep.model.reference import conv2d_reference, maxpool2d_reference
from convsweep.model.variants import ConvShape

REPO = Path(__file__).resolve().parent.parent
LENET = REPO / "networks" / "lenet86.yaml"


@pytest.fixture(scope="module")
def lenet() -> Network:
    return load_network(LENET)


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    return load_dataset("mnist5k", cache_dir=tmp_path_factory.mktemp("cache"))


def random_weights(network: Network, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {key: (rng.standard_normal(shape) * 0.2).astype(np.float32) for key, shape in weight_shapes(network).items()}


def write_network(tmp_path, layers, **top) -> Path:
    spec = {"name": "t", "input": [1, 12, 12], "layers": layers, **top}
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_lenet86_shapes(lenet):
    shapes = {layer.name: (layer.in_shape, layer.out_shape) for layer in lenet.layers}
    assert shapes["conv1"] == ((1, 86, 86), (4, 80, 80))
    assert shapes["pool1"] == ((4, 80, 80), (4, 40, 40))
    assert shapes["conv2"] == ((4, 40, 40), (16, 34, 34))
    assert shapes["pool2"] == ((16, 34, 34), (16, 8, 8))
    assert shapes["flatten"][1] == (1024,)
    assert shapes["fc1"] == ((1024,), (32,))
    assert shapes["fc2"] == ((32,), (10,))
    assert [layer.name for layer in lenet.conv_layers] == ["conv1", "conv2"]
    assert lenet.layer("pool2").stride == 4 and lenet.layer("conv2").stride == 1
    assert lenet.dtype == "float32" and lenet.input_shape == (1, 86, 86)
    assert lenet.weights_path == REPO / "data" / "lenet86-weights.npz"
    assert lenet.conv_shape(lenet.layer("conv2"), 100) == ConvShape(B=100, C=4, M=16, H=40, W=40, K=7, S=1)
    pooled = lenet.variant_shape(lenet.layer("conv1"), ("relu", "maxpool"), 100)  # a fused pool sets P, PS
    assert (pooled.P, pooled.PS, pooled.out_shape) == (2, 2, (100, 4, 40, 40))


def test_unknown_layer_name(lenet):
    with pytest.raises(ConfigError, match="no layer named 'conv3'"):
        lenet.layer("conv3")


CONV = {"name": "c", "type": "conv2d", "out_channels": 2, "kernel": 3}


@pytest.mark.parametrize(
    "layers, top, message",
    [
        ([{**CONV, "kernel": "seven"}], {}, r"layers\[0\]\.kernel: expected a positive integer of at most 65,536, "
                                           r"got 'seven'"),
        ([{**CONV, "kernel": 0}], {}, r"layers\[0\]\.kernel: expected a positive integer of at most 65,536, got 0"),
        ([{**CONV, "kernel": 13}], {}, r"layers\[0\]\.kernel: expected at most the input size 12x12, got 13"),
        (
            [CONV, {"name": "p", "type": "maxpool2d", "size": 2, "stride": -1}],
            {},
            r"layers\[1\]\.stride: expected a positive",
        ),
        ([{**CONV, "padding": 1}], {}, r"layers\[0\]\.padding: unknown key"),
        ([{"name": "c", "type": "conv2d", "kernel": 3}], {}, r"layers\[0\]\.out_channels: missing required key"),
        ([{"name": "c", "type": "conv3d"}], {}, r"layers\[0\]\.type: expected one of conv2d, .*got 'conv3d'"),
        ([{"type": "relu"}], {}, r"layers\[0\]\.name: missing required key"),
        ([CONV, {"name": "c", "type": "relu"}], {}, r"layers\[1\]\.name: expected a unique name, got duplicate 'c'"),
        ([CONV, {"name": "d", "type": "dense", "out_features": 3}], {}, r"layers\[1\]: dense expected a flat input"),
        ([{"name": "p", "type": "maxpool2d", "size": 20}], {}, r"layers\[0\]\.size: expected at most"),
        ([], {}, r"layers: expected a list of 1 to 256 layers"),
        ([CONV], {"dtype": "int8"}, r"dtype: expected one of"),
        ([CONV], {"dtype": "float16"}, r"dtype: expected one of float32, float64"),  # no kernel stores fp16 tensors
        ([CONV], {"colour": "red"}, r"colour: unknown key"),
        ([CONV], {"input": [1, 12]}, r"input: expected \[C, H, W\]"),
    ],
)
def test_bad_network_yaml_names_the_key(tmp_path, layers, top, message):
    path = write_network(tmp_path, layers, **top)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {message}") as info:
        load_network(path)
    assert "\n" not in str(info.value)


def test_network_yaml_missing_and_malformed(tmp_path):
    with pytest.raises(ConfigError, match=r"absent\.yaml: no such file"):
        load_network(tmp_path / "absent.yaml")
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nlayers: [\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml:\d+: not valid YAML"):
        load_network(path)


def test_strided_conv_and_pool_shapes(tmp_path):
    path = write_network(
        tmp_path,
        [
            {"name": "c", "type": "conv2d", "out_channels": 10, "kernel": 5, "stride": 5},
            {"name": "p", "type": "maxpool2d", "size": 3, "stride": 2},
        ],
        input=[1, 100, 100],
        dtype="float64",
    )
    network = load_network(path)
    assert network.layer("c").out_shape == (10, 20, 20)
    assert network.layer("p").out_shape == (10, 9, 9)
    assert network.weights_path is None
    with pytest.raises(DataError, match=r"net\.yaml: weights: missing"):
        load_weights(network)


def naive_conv(x, w, b, stride):
    batch, c, h, width = x.shape
    m, _, k, _ = w.shape
    h_out, w_out = (h - k) // stride + 1, (width - k) // stride + 1
    y = np.zeros((batch, m, h_out, w_out))
    for n in range(batch):
        for mm in range(m):
            for i in range(h_out):
                for j in range(w_out):
                    patch = x[n, :, i * stride : i * stride + k, j * stride : j * stride + k]
                    y[n, mm, i, j] = b[mm] + np.sum(patch * w[mm])
    return y


@pytest.mark.parametrize(
    "batch, c, m, h, w, k, s",
    [
        (2, 1, 4, 12, 12, 7, 1),  # conv1-like
        (3, 4, 2, 9, 11, 3, 1),  # C > M, K=3, non-square
        (2, 3, 5, 10, 10, 3, 2),  # stride 2 with a dropped last column
        (1, 2, 3, 13, 8, 5, 5),  # stride = kernel, the double-precision seed's pattern
        (2, 6, 1, 7, 7, 7, 1),  # kernel covers the whole input
    ],
)
def test_conv2d_reference_matches_naive_loop(batch, c, m, h, w, k, s):
    rng = np.random.default_rng(batch * 100 + k)
    x = rng.standard_normal((batch, c, h, w))
    weight = rng.standard_normal((m, c, k, k))
    bias = rng.standard_normal(m)
    y = conv2d_reference(x, weight, bias, stride=s)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, naive_conv(x, weight, bias, s), rtol=1e-12, atol=1e-12)


def test_conv2d_reference_chunks_and_float32(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 2, 10, 10))
    weight, bias = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)
    whole = conv2d_reference(x, weight, bias)
    monkeypatch.setattr("convsweep.model.reference.CONV_CHUNK_ELEMENTS", 2 * 3 * 3 * 8 * 8)  # one image per chunk
    np.testing.assert_allclose(conv2d_reference(x, weight, bias), whole, rtol=1e-13)
    monkeypatch.setattr("convsweep.model.reference.CONV_CHUNK_ELEMENTS", 1)  # too large for columns: shifted GEMMs
    np.testing.assert_allclose(conv2d_reference(x, weight, bias, stride=2), naive_conv(x, weight, bias, 2), rtol=1e-12, atol=1e-12)
    single = conv2d_reference(x.astype(np.float32), weight, bias)
    assert single.dtype == np.float32
    np.testing.assert_allclose(single, whole, rtol=1e-4, atol=1e-4)


def test_maxpool_floor_and_overlap():
    x = np.arange(2 * 1 * 7 * 7, dtype=np.float64).reshape(2, 1, 7, 7)
    np.testing.assert_array_equal(maxpool2d_reference(x, 2, 2)[0, 0], x[0, 0, 1:6:2, 1:6:2])
    overlapping = maxpool2d_reference(-x, 3, 2)
    assert overlapping.shape == (2, 1, 3, 3)
    assert overlapping[0, 0, 1, 1] == -x[0, 0, 2, 2]


@pytest.mark.parametrize("workers, n", [(3, 200), (2, 64), (4, 1)])
def test_the_reference_split_over_threads_is_bit_for_bit_the_one_thread_reference(lenet, mnist, workers, n):
    weights = random_weights(lenet)
    x = mnist.images[:n]
    one = reference_forward(lenet, weights, x)
    split = reference_forward_parallel(lenet, weights, x, workers=workers, least=1)
    assert split.dtype == np.float64 and np.array_equal(split, one)


def test_the_split_reference_runs_where_the_os_tells_no_cpu_affinity(lenet, mnist, monkeypatch):
    monkeypatch.delattr("os.sched_getaffinity", raising=False)  # macOS and Windows have none
    weights = random_weights(lenet)
    x = mnist.images[:130]
    assert np.array_equal(reference_forward_parallel(lenet, weights, x, least=1), reference_forward(lenet, weights, x))


def test_reference_layer_checks_input_shape(lenet):
    with pytest.raises(ShapeError, match=r"layer conv2: expected input \[B, 4, 40, 40\]"):
        reference_layer(lenet.layer("conv2"), random_weights(lenet), np.zeros((1, 4, 41, 40)))


def test_reference_forward_float32_agrees_with_float64(lenet, mnist):
    weights = random_weights(lenet)
    x = mnist.images[::50]
    y64 = reference_forward(lenet, weights, x)
    y32 = reference_forward(lenet, weights, x, dtype=np.float32)
    assert y64.shape == (100, 10) and y64.dtype == np.float64 and y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-4 * np.abs(y64).max())
    h = x.astype(np.float64)
    for layer in lenet.layers:
        h = reference_layer(layer, weights, h)
    np.testing.assert_allclose(h, y64, rtol=1e-12)


def test_weights_load_with_the_right_shapes(lenet):
    weights = load_weights(lenet)
    assert {key: value.shape for key, value in weights.items()} == weight_shapes(lenet)
    assert weights["conv1.weight"].shape == (4, 1, 7, 7) and weights["fc1.weight"].shape == (32, 1024)
    assert all(value.dtype == np.float32 for value in weights.values())


def bad_weights_network(tmp_path, lenet, arrays) -> Network:
    np.savez(tmp_path / "w.npz", **arrays)
    text = LENET.read_text().replace("../data/lenet86-weights.npz", "w.npz")
    (tmp_path / "lenet.yaml").write_text(text)
    return load_network(tmp_path / "lenet.yaml")


def test_weights_wrong_shape_missing_or_extra(tmp_path, lenet):
    good = random_weights(lenet)
    network = bad_weights_network(tmp_path, lenet, {**good, "conv2.weight": np.zeros((16, 4, 5, 5), np.float32)})
    with pytest.raises(DataError, match=r"w\.npz: conv2\.weight: expected shape \(16, 4, 7, 7\), got \(16, 4, 5, 5\)"):
        load_weights(network)
    network = bad_weights_network(tmp_path, lenet, {k: v for k, v in good.items() if k != "fc1.bias"})
    with pytest.raises(DataError, match=r"w\.npz: fc1\.bias: missing; expected shape \(32,\)"):
        load_weights(network)
    network = bad_weights_network(tmp_path, lenet, {**good, "fc3.weight": np.zeros(3)})
    with pytest.raises(DataError, match=r"w\.npz: fc3\.weight: unexpected array"):
        load_weights(network)
    (tmp_path / "w.npz").unlink()
    with pytest.raises(DataError, match=r"w\.npz: no such file"):
        load_weights(network)


def test_trained_weights_reach_the_recorded_accuracy(lenet, mnist):
    record = json.loads(lenet.weights_path.with_suffix(".json").read_text())
    weights = load_weights(lenet)
    held_out = np.array(record["split"]["held_out_indices"])
    assert len(held_out) == 1000
    assert np.bincount(mnist.labels[held_out]).tolist() == [100] * 10
    predictions = reference_forward(lenet, weights, mnist.images[held_out]).argmax(1)
    assert np.mean(predictions == mnist.labels[held_out]) == pytest.approx(record["held_out_accuracy"], abs=1e-9)
    all_predictions = reference_forward(lenet, weights, mnist.images, dtype=np.float32).argmax(1)
    assert np.mean(all_predictions == mnist.labels) == pytest.approx(record["all_accuracy"], abs=1e-9)
    assert record["held_out_accuracy"] > 0.95


def test_fused_layers_must_follow_the_conv():
    lenet = load_network(REPO / "networks" / "lenet86.yaml")
    assert [layer.name for layer in lenet.fused_layers("conv1", ("relu", "maxpool"))] == ["relu1", "pool1"]
    assert lenet.fused_layers("conv2", ()) == ()
    assert [layer.name for layer in lenet.relu_after("fc1")] == ["relu3"] and lenet.relu_after("fc2") == ()
    fp64 = load_network(REPO / "networks" / "fp64_stride5.yaml")
    with pytest.raises(ShapeError, match="conv1 is followed by relu, flatten, but the variant fuses relu, maxpool"):
        fp64.fused_layers("conv1", ("relu", "maxpool"))


def test_the_other_workloads_load_with_seeded_random_weights():
    wide = load_network(REPO / "networks" / "conv256.yaml")
    assert wide.layers[0].out_shape == (256, 224, 224) and wide.layers[-1].out_shape == (256, 112, 112)
    fp64 = load_network(REPO / "networks" / "fp64_stride5.yaml")
    assert fp64.dtype == "float64" and fp64.layer("flatten").out_shape == (4000,)
    first, again = load_weights(fp64), load_weights(fp64)
    assert all(np.array_equal(first[k], again[k]) and first[k].dtype == np.float64 for k in first)
    assert 0 < np.abs(first["fc1.weight"]).max() <= 1 / np.sqrt(4000)


def test_a_fused_network_shape_names_its_later_layers_and_swallows_them():
    from convsweep.base.paths import ROOT
    from convsweep.model.variants import get_variant

    lenet = load_network(ROOT / "networks" / "lenet86.yaml")
    fuses = get_variant("fp16_fused_network").fuses
    shape = lenet.variant_shape(lenet.layer("conv1"), fuses, 5)
    assert (shape.P, shape.PS, shape.out_shape) == (2, 2, (5, 10))  # its own pool; it writes the logits
    assert {k: shape.names()[k] for k in ("M2", "K2", "S2", "P2", "PS2", "N1", "N2")} == \
        {"M2": 16, "K2": 7, "S2": 1, "P2": 4, "PS2": 4, "N1": 32, "N2": 10}
    assert shape.flops == 5 * (2 * 4 * 80 * 80 * 49 + 2 * 16 * 34 * 34 * 4 * 49 + 2 * 1024 * 32 + 2 * 32 * 10)
    steps = lenet.steps({"conv1": fuses})
    assert [step.layer.name for step in steps] == ["conv1"] and steps[0].last.name == "fc2"
    assert lenet.swallowed({"conv1": fuses}) == {"conv2": "conv1"}
    assert lenet.swallowed({"conv1": ("relu", "maxpool"), "conv2": ()}) == {}
    with pytest.raises(ShapeError, match="runs in a network, not on a lone layer"):
        pooled = lenet.conv_shape(lenet.layer("conv1"), 5, (lenet.layer("relu1"), lenet.layer("pool1")))
        get_variant("fp16_fused_network").check_shape(pooled, {"BLOCKS": 132})


def test_sizes_in_a_network_file_are_bounded(tmp_path):
    path = write_network(tmp_path, [{**CONV, "out_channels": 10**9}])
    with pytest.raises(ConfigError, match=r"layers\[0\]\.out_channels: expected a positive integer of at most 65,536, "
                                          r"got 1000000000$"):
        load_network(path)
    path.write_text("name: t\ninput: [1, 12, 12]\nlayers:\n  - {name: c, type: relu}\nname: u\n")
    with pytest.raises(ConfigError, match=r"net\.yaml:5: duplicate key 'name'$"):
        load_network(path)


def write_weights(tmp_path, network: Network, **changes) -> Path:
    arrays = {**random_weights(network), **changes}
    np.savez(tmp_path / "w.npz", **{k: v for k, v in arrays.items() if v is not None})
    return tmp_path / "w.npz"


def test_check_weights_compares_the_file_with_the_layers_from_the_headers(tmp_path, lenet):
    from convsweep.model.network import check_weights

    check_weights(lenet)  # the committed weights fit
    net = load_network(write_network(tmp_path, [CONV], weights="w.npz"))
    path = write_weights(tmp_path, net)
    check_weights(net)
    write_weights(tmp_path, net, **{"c.weight": np.zeros((2, 1, 5, 5), np.float32)})
    with pytest.raises(DataError, match=r"w\.npz: c\.weight: expected shape \(2, 1, 3, 3\), got \(2, 1, 5, 5\)$"):
        check_weights(net)  # a changed file is read again
    write_weights(tmp_path, net, **{"c.bias": None})
    with pytest.raises(DataError, match=r"w\.npz: c\.bias: missing; expected shape \(2,\)$"):
        check_weights(net)
    write_weights(tmp_path, net, **{"d.weight": np.zeros(3, np.float32)})
    with pytest.raises(DataError, match=r"w\.npz: d\.weight: unexpected array; t expects c\.weight, c\.bias$"):
        check_weights(net)
    write_weights(tmp_path, net, **{"c.bias": np.zeros(2, np.int32)})
    with pytest.raises(DataError, match=r"w\.npz: c\.bias: expected floating-point values, got int32$"):
        check_weights(net)
    path.write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"w\.npz: not a readable \.npz file"):
        check_weights(net)
    path.unlink()
    with pytest.raises(DataError, match=r"w\.npz: no such file \(weights of .*net\.yaml\)$"):
        check_weights(net)


def test_check_weights_reads_headers_only(tmp_path, monkeypatch):
    """The planner checks every sweep's weights: it must not load their arrays (np.load)."""
    from convsweep.model import network as network_mod

    net = load_network(write_network(tmp_path, [CONV], weights="w.npz"))
    write_weights(tmp_path, net)
    monkeypatch.setattr(network_mod.np, "load", lambda *a, **k: pytest.fail("np.load called"))
    network_mod.check_weights(net)
