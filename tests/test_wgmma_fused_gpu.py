"""wgmma_fused_network on a Hopper GPU (skipped with the reason elsewhere): the whole network's logits
(prepare_weights when the weights are bound, then network_forward) against float64 on fresh random images
(new ones every call) with NaN-poisoned logits, at batch 1, 7 and 10001, every registered setting (batch
300; 1 and 7 on both conv2 schedules, C2R 1 and 2), LeNet-86's trained weights and random ones, an 84 x 84
input (the padded staging and strips, odd pooled sizes), and weights bound anew to an op that ran; then
jobs as fp16_fused_network's tests run them: any batch and chunking, and the accuracy at batch 10000 on
mnist5k (cycled) equal to 0.9932."""
import numpy as np
import pytest

from kernel_checks import gpu_fixture, measure_like_the_reference, setting_id
from test_gpu import reference_accuracy, spec
from test_wgmma_fused import network_of_size, random_weights

from convsweep.model.checks import normwise_error
from convsweep.model.network import load_network, load_weights, reference_forward_parallel
from convsweep.base.paths import ROOT
from convsweep.model.variants import load_registry

pytestmark = pytest.mark.gpu

NAME = "wgmma_fused_network"
VARIANT = load_registry()[NAME]
LENET = load_network(ROOT / "networks/lenet86.yaml")
BOTH = {"conv1": NAME, "conv2": NAME}  # conv1's kernel computes conv2 too (a job may name either way)
gpu = gpu_fixture(VARIANT)


def forward(gpu, network, weights, params, images) -> np.ndarray:
    """The network on `images` with this variant at conv1 (it swallows the rest), logits poisoned before."""
    from convsweep.measure.runner import ConvPlan, GpuNetwork

    plan = ConvPlan({"conv1": VARIANT}, {"conv1": VARIANT.resolve_params(params, NAME)})
    with gpu.scope():
        stream = gpu.stream()
        net = GpuNetwork(gpu, network, weights, plan, 1, len(images))
        x_dev = gpu.to_device(images, stream)
        logits_dev = gpu.alloc((len(images), network.layers[-1].out_shape[0]), np.float32)
        gpu.fill(logits_dev, 0xFF, stream)  # NaN: a logit no block writes fails
        net.enqueue(stream, net.lanes[0], x_dev, logits_dev, len(images))
        logits = np.empty(logits_dev.shape, np.float32)
        gpu.download(logits_dev, logits, stream)
        stream.sync()
    return logits


def check(gpu, network, weights, params, batch) -> float:
    images = np.random.default_rng().uniform(0.0, 1.0, (batch, *network.input_shape)).astype(np.float32)
    logits = forward(gpu, network, weights, params, images)
    assert np.isfinite(logits).all(), "unwritten (poisoned) logits"
    return normwise_error(logits, reference_forward_parallel(network, weights, images))


CASES = [(p, 300) for p in VARIANT.all_combinations()] + [(VARIANT.defaults(), b) for b in (1, 7)] + [
    ({**VARIANT.defaults(), "C2R": 2}, b) for b in (1, 7)]  # every setting at 300; 1 and 7 on both conv2 schedules


@pytest.mark.parametrize("params, batch", CASES,
                         ids=lambda p: setting_id(p) if isinstance(p, dict) else f"b{p}")
def test_the_network_matches_float64_on_fresh_random_images(gpu, params, batch):
    errors = [check(gpu, LENET, load_weights(LENET), params, batch) for _ in range(2)]  # fresh images each time
    assert max(errors) <= VARIANT.tolerance, errors


@pytest.mark.parametrize("params", [VARIANT.defaults(), {**VARIANT.defaults(), "BLOCKS": 132, "C2R": 2}],
                         ids=["defaults", "BLOCKS132-C2R2"])
def test_the_network_matches_float64_at_batch_10001(gpu, params):
    """> BLOCKS: each block takes 38-76 images through its bulk-copy buffer and its 8-image dense groups."""
    assert check(gpu, LENET, load_weights(LENET), params, 10001) <= VARIANT.tolerance


@pytest.mark.parametrize("batch", [1, 7, 10001])
def test_random_weights_too(gpu, batch):
    rng = np.random.default_rng()
    assert check(gpu, LENET, random_weights(rng, 86), VARIANT.defaults(), batch) <= VARIANT.tolerance


def test_binding_new_weights_prepares_them_again(gpu):
    """The prepared buffer (registry prepare: fc1's fragments, the B tiles) follows the weights: one op bound
    to LeNet-86's trained weights, run, then bound to random ones, computes the random ones' logits."""
    from convsweep.measure.runner import ConvPlan, GpuNetwork

    rng = np.random.default_rng()
    images = rng.uniform(0.0, 1.0, (300, *LENET.input_shape)).astype(np.float32)
    plan = ConvPlan({"conv1": VARIANT}, {"conv1": VARIANT.defaults()})
    fresh = random_weights(rng, 86)
    with gpu.scope():
        stream = gpu.stream()
        net = GpuNetwork(gpu, LENET, load_weights(LENET), plan, 1, len(images))
        x_dev = gpu.to_device(images, stream)
        logits_dev = gpu.alloc((len(images), 10), np.float32)
        logits = np.empty(logits_dev.shape, np.float32)
        for weights in (load_weights(LENET), fresh):
            if weights is fresh:
                dev = {name: gpu.to_device(array, stream) for name, array in fresh.items()}
                tail = tuple(dev[f"{layer}.{part}"] for layer in ("conv2", "fc1", "fc2") for part in ("weight", "bias"))
                net.convs["conv1"].bind_weights(dev["conv1.weight"], dev["conv1.bias"], stream, tail)
            gpu.fill(logits_dev, 0xFF, stream)
            net.enqueue(stream, net.lanes[0], x_dev, logits_dev, len(images))
            gpu.download(logits_dev, logits, stream)
            stream.sync()
            assert normwise_error(logits, reference_forward_parallel(LENET, weights, images)) <= VARIANT.tolerance


@pytest.mark.parametrize("c2r", [1, 2])
def test_an_84_pixel_input_takes_the_padded_path(gpu, tmp_path, c2r):
    network = network_of_size(tmp_path, 84)
    weights = random_weights(np.random.default_rng(), 84)
    assert check(gpu, network, weights, {**VARIANT.defaults(), "C2R": c2r}, 9) <= VARIANT.tolerance


@pytest.mark.parametrize("batch, streams, chunk", [(1, 1, None), (7, 3, 2), (10001, 1, None), (10001, 4, 1250)])
def test_it_runs_any_batch_and_any_chunking_as_a_job(batch, streams, chunk):
    """As fp16_fused_network's test: logits poisoned before each pass, checked against float64 and the
    reference's accuracy; one timed layer (conv1) holds every op."""
    run = spec("events", batch=batch, repeats=2, streams=streams, host_memory="pinned" if streams > 1 else "pageable",
               chunk_images=chunk, variants=BOTH, params={"conv1": {}})
    result = measure_like_the_reference(run, VARIANT.tolerance)
    assert list(result.timings.op_time_ms) == ["conv1"]
    assert {b["variant"] for b in result.builds} == {NAME, "layers"}


def test_the_accuracy_at_batch_10000_is_the_references_0_9932():
    from convsweep.measure.settings import measure

    result = measure(spec("events", batch=10000, repeats=3, variants=BOTH, params={"conv1": {}}), keep_logits=True)
    assert result.status == "ok", result.error
    assert result.max_rel_err <= VARIANT.tolerance
    assert round(result.accuracy, 4) == 0.9932 == round(reference_accuracy(10000), 4)
