"""The input's formats on a real GPU (skipped with the reason elsewhere): the device's first step
(layers.cu's convert_* and upsample_u8) against the host's own fp32 images, the fp16 variants'
logits from fp16 input against fp32's, and whole jobs in every format. The CPU side of the same
formats is in tests/test_formats.py, which also says why UPSCALE_ULPS is the bound for the upscale.
"""
import numpy as np
import pytest

from convsweep.sweep.config import RunSpec
from convsweep.inputs.formats import FORMATS
from convsweep.model.network import load_network
from convsweep.base.paths import ROOT
from convsweep.model.variants import load_registry

from test_formats import UPSCALE_ULPS
from test_gpu import run_job, takes_every_lenet_conv

pytestmark = pytest.mark.gpu

LENET = load_network(ROOT / "networks/lenet86.yaml")
REGISTRY = load_registry()
FP16_VARIANTS = [name for name, var in REGISTRY.items()  # those that run both LeNet-86 convs (not wgmma_conv2)
                 if var.precision == "fp16" and not var.is_cpu and takes_every_lenet_conv(var)]
PIXEL_BYTES = {"fp32": 4 * 86 * 86, "fp16": 2 * 86 * 86, "u8": 86 * 86, "u8-source": 28 * 28}  # per image


@pytest.fixture(scope="module")
def gpu():
    from convsweep.device.gpu import Gpu

    with Gpu() as g:
        yield g


def spec(**over) -> RunSpec:
    base = dict(experiment="gpu-test", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}},
                batch=512, streams=1, host_memory="pinned", repeats=3, warmup=1, profiler="events")
    base.update(over)
    return RunSpec(**base)


def made_on_the_gpu(gpu, name: str, batch: int = 300):
    """LeNet-86 with `name`'s first layer on the GPU: a batch shipped as `name` carries it, enqueued
    once; returns (the dataset, the batch's indices, what the first layer wrote: the network's input
    [batch, 1, 86, 86]), its buffer poisoned (0xFF bytes: NaN) before, so an element it skips shows."""
    from convsweep.inputs.data import batch_indices, load_dataset
    from convsweep.model.network import load_weights
    from convsweep.measure.runner import ConvPlan, GpuNetwork
    from convsweep.model.variants import get_variant

    dataset = load_dataset("mnist5k", image_size=86)
    idx = batch_indices(len(dataset.images), batch)
    fmt = FORMATS[name]
    network = fmt.network(LENET, dataset)
    assert network.layers[0].name == "input" and network.layers[0].type == fmt.first_layer
    shipped = np.ascontiguousarray(fmt.ship(dataset)[idx])
    assert shipped.dtype == network.shipped_dtype
    naive = get_variant("naive")
    plan = ConvPlan({"conv1": naive, "conv2": naive}, {layer: naive.resolve_params({}, layer) for layer in ("conv1", "conv2")})
    with gpu.scope():
        stream = gpu.stream()
        net = GpuNetwork(gpu, network, load_weights(LENET), plan, 1, batch)
        lane = net.lanes[0]
        made = lane.outputs["input"]
        assert made.shape == (batch, 1, 86, 86) and made.dtype == np.float32
        gpu.fill(made, 0xFF, stream)
        x = gpu.to_device(shipped, stream)
        logits = gpu.alloc((batch, 10), np.float32)
        net.enqueue(stream, lane, x, logits, batch)
        out = np.empty(made.shape, made.dtype)
        gpu.download(made, out, stream)
        stream.sync()
    assert np.isfinite(out).all(), "unwritten (poisoned) elements of the network's input"
    return dataset, idx, out


def test_the_gpus_upscale_of_the_stored_digits_equals_the_hosts_fp32_images(gpu):
    dataset, idx, made = made_on_the_gpu(gpu, "u8-source")
    assert np.abs(made.astype(np.float64) - dataset.images[idx]).max() <= UPSCALE_ULPS
    assert made.min() >= 0.0 and made.max() <= 1.0


def test_the_gpus_u8_convert_is_each_byte_divided_by_255_in_float32_bit_for_bit(gpu):
    dataset, idx, made = made_on_the_gpu(gpu, "u8")
    shipped = FORMATS["u8"].ship(dataset)[idx]
    np.testing.assert_array_equal(made, shipped.astype(np.float32) / np.float32(255.0))


def test_the_gpus_fp16_convert_is_the_half_values_exactly(gpu):
    dataset, idx, made = made_on_the_gpu(gpu, "fp16")
    np.testing.assert_array_equal(made, dataset.images[idx].astype(np.float16).astype(np.float32))


@pytest.mark.alone  # its verdict rests on the caching test's times: no other worker's kernels beside it
@pytest.mark.parametrize("variant", FP16_VARIANTS)
def test_an_fp16_variant_computes_the_same_logits_from_fp16_input_as_from_fp32(variant):
    """The fp16 kernels round their input to half (to nearest) anyway: shipping it as half loses
    nothing, so the logits are bit for bit those of the fp32 run (the seed pass's, keep_logits)."""
    from convsweep.measure.settings import measure

    runs = {name: measure(spec(variants={"conv1": variant, "conv2": variant}, input_format=name, repeats=1),
                          keep_logits=True) for name in ("fp32", "fp16")}
    for name, m in runs.items():
        assert m.status == "ok", (name, m.error)
        assert m.images["input_bytes"] == 512 * PIXEL_BYTES[name]
        assert np.isfinite(m.logits).all() and m.logits.shape == (512, 10)
    np.testing.assert_array_equal(runs["fp16"].logits, runs["fp32"].logits)


@pytest.mark.alone  # its verdict rests on the caching test's times
def test_a_whole_job_in_each_format_is_ok_and_scores_within_a_tenth_of_a_point_of_fp32(tmp_path):
    """Batch 1000 of the fused network, every pass checked against its format's float64 reference
    (fresh rounds in the format too); the accuracy is the seed pass's, against the labels."""
    fused = {"conv1": "fp16_fused_network", "conv2": "fp16_fused_network"}
    results = {name: run_job(spec(variants=fused, batch=1000, input_format=name), tmp_path / f"{name}.json")
               for name in FORMATS}
    for name, m in results.items():
        assert m.status == "ok", (name, m.error)
        assert m.spec.get("input_format", "fp32") == name
        assert m.images["input_bytes"] == 1000 * PIXEL_BYTES[name]
        assert m.integrity.fresh_passes > 0 and m.timings.forward_ms > 0
    for name in ("fp16", "u8", "u8-source"):
        assert abs(results[name].accuracy - results["fp32"].accuracy) <= 0.001, (name, results[name].accuracy)
