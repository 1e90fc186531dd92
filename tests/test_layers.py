"""convsweep.model.layers: each layer kind's shapes, weights, float64 reference and traffic, checked against
independent numpy loops on tiny networks; the GPU enqueue functions are exercised by the GPU tests."""
import numpy as np
import pytest
import yaml

from convsweep.base.errors import ConfigError, ShapeError
from convsweep.device.gpu import DeviceArray
from convsweep.model.layers import FLATTEN, LAYER_KINDS
from convsweep.model.network import Step, load_network, reference_layer, weight_shapes
from convsweep.base.paths import ROOT

LENET_LAYERS = yaml.safe_load((ROOT / "networks/lenet86.yaml").read_text())["layers"]

# One small layer of every kind: input [2, 17, 11] -> conv (3, 8, 5) -> relu -> pool (3, 7, 4) -> pool
# (3, 3, 2) -> flatten 18 -> dense 5. The two pools: overlapping windows, and the default stride with a
# partial last window dropped. No side is square or 1, so a swapped axis shows.
TINY_LAYERS = [
    {"name": "conv", "type": "conv2d", "out_channels": 3, "kernel": 3, "stride": 2},
    {"name": "act", "type": "relu"},
    {"name": "pool_overlap", "type": "maxpool2d", "size": 2, "stride": 1},
    {"name": "pool", "type": "maxpool2d", "size": 2},
    {"name": "flat", "type": "flatten"},
    {"name": "fc", "type": "dense", "out_features": 5},
]


# The input's first layers (convsweep.inputs.formats): bytes onto [0, 1], then a bilinear upscale of each
# non-square plane to 13 x 13: input [2, 7, 5] -> convert -> upsample (2, 13, 13).
TINY_INPUT_LAYERS = [
    {"name": "bytes", "type": "convert", "divisor": 255},
    {"name": "up", "type": "upsample", "size": 13},
]


def write_network(tmp_path, layers, name="tiny", input_shape=(2, 17, 11), dtype="float64"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "input": list(input_shape), "dtype": dtype, "weights": "random",
                                    "layers": layers}, sort_keys=False))
    return load_network(path)


@pytest.fixture
def tiny(tmp_path):
    return write_network(tmp_path, TINY_LAYERS)


# -- independent float64 computations, loop by loop ----------------------------------------------
def naive_conv(x, w, b, s):
    batch, c, h, width = x.shape
    m, _, k, _ = w.shape
    y = np.zeros((batch, m, (h - k) // s + 1, (width - k) // s + 1))
    for n in range(batch):
        for o in range(m):
            for i in range(y.shape[2]):
                for j in range(y.shape[3]):
                    total = b[o]
                    for ci in range(c):
                        for p in range(k):
                            for q in range(k):
                                total += x[n, ci, i * s + p, j * s + q] * w[o, ci, p, q]
                    y[n, o, i, j] = total
    return y


def naive_pool(x, size, s):
    batch, c, h, width = x.shape
    y = np.zeros((batch, c, (h - size) // s + 1, (width - size) // s + 1))
    for n in range(batch):
        for ci in range(c):
            for i in range(y.shape[2]):
                for j in range(y.shape[3]):
                    y[n, ci, i, j] = max(x[n, ci, i * s + p, j * s + q] for p in range(size) for q in range(size))
    return y


def naive_relu(x):
    y = np.array(x, dtype=np.float64)
    y[y < 0] = 0.0
    return y


def naive_flatten(x):
    batch, c, h, width = x.shape
    y = np.zeros((batch, c * h * width))
    for n in range(batch):
        for ci in range(c):
            for i in range(h):
                for j in range(width):
                    y[n, (ci * h + i) * width + j] = x[n, ci, i, j]
    return y


def naive_dense(x, w, b):
    y = np.zeros((x.shape[0], w.shape[0]))
    for n in range(x.shape[0]):
        for o in range(w.shape[0]):
            y[n, o] = b[o] + sum(x[n, i] * w[o, i] for i in range(x.shape[1]))
    return y


def naive_upsample(x, size):
    """Each output's two nearest sources along each axis, half-pixel centres, clamped at the edges."""
    batch, c, h, width = x.shape

    def taps(i, n_in):
        src = max((i + 0.5) * n_in / size - 0.5, 0.0)
        lo = min(int(np.floor(src)), n_in - 1)
        return lo, min(lo + 1, n_in - 1), src - lo

    y = np.zeros((batch, c, size, size))
    for i in range(size):
        r0, r1, fr = taps(i, h)
        for j in range(size):
            c0, c1, fc = taps(j, width)
            y[:, :, i, j] = ((1 - fr) * ((1 - fc) * x[:, :, r0, c0] + fc * x[:, :, r0, c1])
                             + fr * ((1 - fc) * x[:, :, r1, c0] + fc * x[:, :, r1, c1]))
    return np.clip(y, 0.0, 1.0)


def naive(layer, weights, x):
    name = layer.name
    if layer.type == "convert":
        return x / layer.divisor
    if layer.type == "upsample":
        return naive_upsample(x / layer.divisor, layer.size)
    if layer.type == "conv2d":
        return naive_conv(x, weights[f"{name}.weight"], weights[f"{name}.bias"], layer.stride)
    if layer.type == "maxpool2d":
        return naive_pool(x, layer.size, layer.stride)
    if layer.type == "relu":
        return naive_relu(x)
    if layer.type == "flatten":
        return naive_flatten(x)
    if layer.type == "dense":
        return naive_dense(x, weights[f"{name}.weight"], weights[f"{name}.bias"])
    raise AssertionError(f"no independent computation for {layer.type}: add one here")


def random_weights_for(network, rng):
    return {key: rng.standard_normal(shape) for key, shape in weight_shapes(network).items()}


def test_the_tiny_networks_have_every_kind(tiny, tiny_input):
    assert {layer.type for layer in (*tiny.layers, *tiny_input.layers)} == set(LAYER_KINDS)


@pytest.fixture
def tiny_input(tmp_path):
    return write_network(tmp_path, TINY_INPUT_LAYERS, name="tiny_input", input_shape=(2, 7, 5))


@pytest.mark.parametrize("name", [layer["name"] for layer in TINY_INPUT_LAYERS])
def test_the_input_layers_reference_matches_float64_loops(tiny_input, name):
    layer = tiny_input.layer(name)
    x = np.random.default_rng().integers(0, 256, (3,) + layer.in_shape).astype(np.float64)
    if name == "up":
        x /= 255.0  # what the convert before it hands on: values in [0, 1]
    y = reference_layer(layer, {}, x)
    expected = naive(layer, {}, x)
    assert y.shape == (3,) + layer.out_shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", [layer["name"] for layer in TINY_LAYERS])
def test_reference_matches_float64_loops(tiny, name):
    rng = np.random.default_rng()
    layer = tiny.layer(name)
    weights = random_weights_for(tiny, rng)
    x = rng.standard_normal((3,) + layer.in_shape)
    y = reference_layer(layer, weights, x)
    expected = naive(layer, weights, x)
    assert y.shape == (3,) + layer.out_shape == expected.shape
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", [layer["name"] for layer in TINY_LAYERS])
def test_reference_keeps_float32_and_stays_close(tiny, name):
    rng = np.random.default_rng()
    layer = tiny.layer(name)
    weights = random_weights_for(tiny, rng)
    x = rng.standard_normal((2,) + layer.in_shape)
    y = reference_layer(layer, {k: v.astype(np.float32) for k, v in weights.items()}, x.astype(np.float32))
    assert y.dtype == np.float32  # the storage precision a GPU runner compares layer by layer
    expected = naive(layer, {k: v.astype(np.float32).astype(np.float64) for k, v in weights.items()},
                     x.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_weight_shapes_follow_the_layers(tiny):
    expected = {"conv.weight": (3, 2, 3, 3), "conv.bias": (3,), "fc.weight": (5, 18), "fc.bias": (5,)}
    assert weight_shapes(tiny) == expected
    by_layer = {layer.name: layer.kind.weights(layer) for layer in tiny.layers}
    assert by_layer == {"conv": {"weight": (3, 2, 3, 3), "bias": (3,)}, "act": {}, "pool_overlap": {}, "pool": {},
                        "flat": {}, "fc": {"weight": (5, 18), "bias": (5,)}}


def test_inferred_shapes(tiny):
    shapes = [(layer.in_shape, layer.out_shape) for layer in tiny.layers]
    assert shapes == [((2, 17, 11), (3, 8, 5)), ((3, 8, 5), (3, 8, 5)), ((3, 8, 5), (3, 7, 4)),
                      ((3, 7, 4), (3, 3, 2)), ((3, 3, 2), (18,)), ((18,), (5,))]
    assert tiny.layer("pool").stride == 2 and tiny.layer("conv").stride == 2


# -- traffic --------------------------------------------------------------------------------------
def plan_traffic(network, batch, fuses=None):
    """Bytes and FLOPs of every launched step, summed as the bench does."""
    e = np.dtype(network.dtype).itemsize
    totals = [step.layer.kind.traffic(network, step, batch, e) for step in network.steps(fuses or {})]
    return sum(b for b, _ in totals), sum(f for _, f in totals)


def with_layer_after(after, layer):
    layers = []
    for spec in LENET_LAYERS:
        layers.append(spec)
        if spec["name"] == after:
            layers.append(layer)
    assert len(layers) == len(LENET_LAYERS) + 1
    return layers


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("float64", 8)])
@pytest.mark.parametrize("batch", [1, 7])
def test_an_extra_relu_adds_one_read_and_one_write(tmp_path, dtype, itemsize, batch):
    base = write_network(tmp_path, LENET_LAYERS, "lenet", (1, 86, 86), dtype)
    extra = write_network(tmp_path, with_layer_after("pool2", {"name": "relu_extra", "type": "relu"}), "lenet_extra",
                          (1, 86, 86), dtype)
    size = 16 * 8 * 8  # pool2's output
    (base_bytes, base_flops), (extra_bytes, extra_flops) = plan_traffic(base, batch), plan_traffic(extra, batch)
    assert extra_bytes - base_bytes == 2 * itemsize * batch * size
    assert extra_flops == base_flops


def test_a_relu_after_a_dense_is_its_epilogue_and_moves_nothing(tmp_path):
    base = write_network(tmp_path, LENET_LAYERS, "lenet", (1, 86, 86), "float32")
    extra = write_network(tmp_path, with_layer_after("fc2", {"name": "relu4", "type": "relu"}), "lenet_extra",
                          (1, 86, 86), "float32")
    assert [step.layer.name for step in extra.steps({})][-1] == "fc2"
    assert plan_traffic(extra, 5) == plan_traffic(base, 5)


def test_fusing_a_conv_drops_the_swallowed_layers_traffic(tmp_path):
    lenet = write_network(tmp_path, LENET_LAYERS, "lenet", (1, 86, 86), "float32")
    unfused, fused = plan_traffic(lenet, 3), plan_traffic(lenet, 3, {"conv1": ("relu", "maxpool")})
    relu1, pool1 = 2 * 4 * 3 * 4 * 80 * 80, 4 * 3 * (4 * 80 * 80 + 4 * 40 * 40)
    conv1 = lenet.conv_shape(lenet.layer("conv1"), 3)
    conv1_fused = lenet.conv_shape(lenet.layer("conv1"), 3, (lenet.layer("relu1"), lenet.layer("pool1")))
    assert unfused[0] - fused[0] == relu1 + pool1 + conv1.min_bytes - conv1_fused.min_bytes
    assert conv1_fused.min_bytes < conv1.min_bytes  # the fused kernel writes the pooled output only


# -- network files and steps ----------------------------------------------------------------------
def test_an_unknown_layer_type_is_one_line_listing_the_known_types(tmp_path):
    layers = [dict(TINY_LAYERS[0]), {"name": "up", "type": "softmax"}]
    with pytest.raises(ConfigError) as info:
        write_network(tmp_path, layers)
    message = str(info.value)
    assert "\n" not in message and "layers[1].type" in message and "'softmax'" in message
    assert str(tmp_path / "tiny.yaml") in message
    for kind in LAYER_KINDS:
        assert kind in message


def test_steps_with_a_fused_conv(tmp_path):
    lenet = load_network(ROOT / "networks/lenet86.yaml")
    steps = lenet.steps({"conv1": ("relu", "maxpool")})
    names = [(step.layer.name, tuple(f.name for f in step.fused)) for step in steps]
    assert names == [("conv1", ("relu1", "pool1")), ("conv2", ()), ("relu2", ()), ("pool2", ()), ("flatten", ()),
                     ("fc1", ("relu3",)), ("fc2", ())]
    assert steps[0].last.name == "pool1" and steps[1].last.name == "conv2" and steps[5].last.name == "relu3"
    relu_only = lenet.steps({"conv1": ("relu",), "conv2": ("relu", "maxpool")})
    assert [step.layer.name for step in relu_only] == ["conv1", "pool1", "conv2", "flatten", "fc1", "fc2"]
    assert [step.last.name for step in relu_only] == ["relu1", "pool1", "pool2", "flatten", "relu3", "fc2"]
    plain = lenet.steps({})
    assert [step.layer.name for step in plain] == [layer.name for layer in lenet.layers if layer.name != "relu3"]
    with pytest.raises(ShapeError):
        lenet.steps({"conv1": ("maxpool",)})


# -- enqueue --------------------------------------------------------------------------------------
def test_flatten_enqueue_is_a_reshaped_view():
    lenet = load_network(ROOT / "networks/lenet86.yaml")
    layer = lenet.layer("flatten")
    x = DeviceArray(0x7F00_0000_1000, (6, 16, 8, 8), np.dtype(np.float32))
    y = FLATTEN.enqueue(None, None, Step(layer), x, None, None)  # no runner, stream, buffer or lane needed
    assert isinstance(y, DeviceArray)
    assert y.shape == (6, 1024) and y.ptr == x.ptr and y.dtype == x.dtype and y.nbytes == x.nbytes
    assert x.shape == (6, 16, 8, 8)  # the input view is unchanged
    assert not FLATTEN.owns_output
