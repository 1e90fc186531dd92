"""The input's format (convsweep.inputs.formats) without a GPU: what each format ships, the first layer that
makes the network's input from it (convert, upsample) against the host's own fp32 images, the
float64 reference computed from exactly what was shipped, fresh rounds in each format, the plan-time
refusals, a job measured on the fake GPU, and layers.cu's new kernels compiling.

The GPU's own convert and upsample are checked in tests/test_formats_gpu.py.
"""
import re

import numpy as np
import pytest
import yaml

from convsweep.sweep.config import JobSpec, RunSpec, expand_config, load_config
from convsweep.inputs.data import load_dataset, upscale_bilinear
from convsweep.base.errors import ConfigError
from convsweep.inputs.formats import FORMATS
from convsweep.inputs.batch import load_batch
from convsweep.model.layers import LAYER_KINDS
from convsweep.measure.settings import measure
from convsweep.model.network import load_network, reference_forward, reference_layer
from convsweep.base.paths import ROOT

from fake_gpu import FAKE

LENET = load_network(ROOT / "networks/lenet86.yaml")
NAMES = list(FORMATS)  # fp32, fp16, u8, u8-source
# What the bus carries of one 86x86 image: its element type and shape.
SHIPPED = {"fp32": ("float32", (1, 86, 86)), "fp16": ("float16", (1, 86, 86)), "u8": ("uint8", (1, 86, 86)),
           "u8-source": ("uint8", (1, 28, 28))}
FP32_EPS = 2.0**-23  # float32's machine epsilon: one ulp of 1.0


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist5k", image_size=86)


def weights64(batch) -> dict:
    return {k: v.astype(np.float64) for k, v in batch.weights.items()}


# -- the u8-source upscale: the kernel's arithmetic, the host's, and the float64 reference's ----------
def kernel_taps(n_in: int, n_out: int):
    """layers.cu's bilinear_source for every output index: (lo, hi, w_lo, w_hi), the source worked
    out in float64 (each step rounded, as its __dmul_rn / __dsub_rn), the weights cast to float32."""
    src = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    return lo, hi, (1.0 - frac).astype(np.float32), frac.astype(np.float32)


def upsample_u8_as_the_kernel_does(raw: np.ndarray, size: int) -> np.ndarray:
    """layers.cu's upsample_u8 in numpy float32: each source byte / 255 in float32, the columns
    blended first (top, bottom), then the rows, clamped to [0, 1]; every product and sum rounded."""
    _, h, w = raw.shape
    r0, r1, wr0, wr1 = kernel_taps(h, size)
    c0, c1, wc0, wc1 = kernel_taps(w, size)
    s = raw.astype(np.float32) / np.float32(255.0)
    blended = s[:, :, c0] * wc0 + s[:, :, c1] * wc1  # [N, h, size]: each source row's columns blended
    top, bottom = blended[:, r0, :], blended[:, r1, :]  # the kernel's `top` and `bottom` of every output
    out = wr0[:, None] * top + wr1[:, None] * bottom
    assert out.dtype == np.float32
    return np.clip(out, np.float32(0.0), np.float32(1.0))


# How far the kernel's float32 upscale may be from data.upscale_bilinear's. Both blend the same float32
# quotients with the same float32 weights, two taps a stage; they differ only in how the roundings
# fall (numpy's BLAS sums a row of the interpolation matrix in its own order, may fuse a multiply-add,
# and so may the GPU). A value below 1 rounds to within half an ulp, 2**-25: three roundings a stage, and
# the column stage's error passed on by row weights that sum to 1, put each side within 3 * 2**-24 of the
# exact blend, 6 * 2**-24 apart at worst. On mnist5k the largest difference is 2 * 2**-24, and so it is for the
# kernel's arithmetic with either multiply-add of each stage fused (as NVRTC may compile it): 4 * 2**-24
# leaves a factor of two for another BLAS, while a wrong tap, weight or divisor is off by ~1e-4 or more.
UPSCALE_ULPS = 4 * 2.0**-24


def test_the_u8_source_kernels_arithmetic_equals_the_hosts_fp32_upscale_on_every_image(mnist):
    host = upscale_bilinear(mnist.raw, 86)
    assert host.shape == (5000, 86, 86) and np.array_equal(host, mnist.images[:, 0])  # what fp32 ships
    worst = 0.0
    for lo in range(0, len(host), 250):  # in chunks: the temporaries stay in cache (2 s at once, 0.4 s so)
        emulated = upsample_u8_as_the_kernel_does(mnist.raw[lo : lo + 250], 86)
        worst = max(worst, float(np.abs(emulated.astype(np.float64) - host[lo : lo + 250]).max()))
    assert worst <= UPSCALE_ULPS


def test_the_float64_upsample_layer_is_within_1e_6_of_the_hosts_fp32_images(mnist):
    network = FORMATS["u8-source"].network(LENET, mnist)
    layer = network.layers[0]
    assert (layer.name, layer.type, layer.in_shape, layer.out_shape, layer.divisor) == \
        ("input", "upsample", (1, 28, 28), (1, 86, 86), 255.0)
    assert network.layers[1:] == LENET.layers and network.input_shape == (1, 28, 28)
    assert network.shipped_dtype == "uint8" and network.dtype == "float32"
    worst = 0.0
    for lo in range(0, len(mnist.raw), 500):
        upscaled = reference_layer(layer, {}, mnist.raw[lo : lo + 500, None].astype(np.float64))
        assert upscaled.dtype == np.float64 and upscaled.min() >= 0.0 and upscaled.max() <= 1.0
        worst = max(worst, float(np.abs(upscaled - mnist.images[lo : lo + 500]).max()))
    assert 0.0 < worst <= 1e-6  # the host's fp32 rounding, and nothing more


# -- what each format ships --------------------------------------------------------------------
def test_u8_ships_the_images_rounded_to_bytes_and_its_reference_input_is_within_half_a_step(mnist):
    shipped = FORMATS["u8"].ship(mnist)
    assert shipped.dtype == np.uint8 and shipped.shape == mnist.images.shape
    np.testing.assert_array_equal(shipped, np.rint(mnist.images * np.float32(255.0)).astype(np.uint8))
    network = FORMATS["u8"].network(LENET, mnist)
    layer = network.layers[0]
    assert (layer.type, layer.in_shape, layer.out_shape, layer.divisor) == ("convert", (1, 86, 86), (1, 86, 86), 255.0)
    assert network.layers[1:] == LENET.layers and network.shipped_dtype == "uint8"
    worst = 0.0
    for lo in range(0, len(shipped), 500):
        converted = reference_layer(layer, {}, shipped[lo : lo + 500].astype(np.float64))
        assert np.array_equal(converted, shipped[lo : lo + 500] / 255.0)
        worst = max(worst, float(np.abs(converted - mnist.images[lo : lo + 500]).max()))
    assert 1 / 510 - 1e-4 < worst <= 1 / 510 + FP32_EPS  # lossy: the upscale's values fall between the grid's points


def test_fp16_ships_the_images_as_half_and_u8_source_the_stored_digits(mnist):
    half = FORMATS["fp16"].ship(mnist)
    assert half.dtype == np.float16 and np.array_equal(half, mnist.images.astype(np.float16))
    layer = FORMATS["fp16"].network(LENET, mnist).layers[0]
    assert (layer.type, layer.divisor) == ("convert", 1.0)
    some = half[:200].astype(np.float64)
    np.testing.assert_array_equal(reference_layer(layer, {}, some), some)  # the half values themselves

    source = FORMATS["u8-source"].ship(mnist)
    assert source.dtype == np.uint8 and source.shape == (5000, 1, 28, 28) and np.array_equal(source[:, 0], mnist.raw)

    assert FORMATS["fp32"].network(LENET, mnist) is LENET  # no first layer: the network's own input
    assert np.array_equal(FORMATS["fp32"].ship(mnist), mnist.images)


# -- the reference sees exactly what was shipped ----------------------------------------------------
def test_each_formats_reference_accuracy_on_all_5000_images_is_within_a_tenth_of_a_point_of_fp32s():
    """The four float64 references of the whole dataset (4 to 7 s each on two cores); the disk cache
    keeps them for the tests below, whose batches read the same references (a Batch's reference is
    its whole dataset's, indexed)."""
    batches = {name: load_batch(LENET, "mnist5k", 5000, name) for name in NAMES}
    accuracy = {}
    for name, batch in batches.items():
        assert sorted(batch.idx) == list(range(5000))
        accuracy[name] = float(np.mean(np.argmax(batch.reference, 1) == batch.dataset.labels[batch.idx]))
    assert accuracy["fp32"] > 0.98, accuracy
    for name in ("fp16", "u8", "u8-source"):
        assert abs(accuracy[name] - accuracy["fp32"]) <= 0.001, accuracy
        # each reference is its own format's: it saw the rounded (or upscaled-from-bytes) input, not fp32's
        assert not np.array_equal(batches[name].reference, batches["fp32"].reference), name


@pytest.mark.parametrize("name", NAMES)
def test_the_batchs_reference_is_the_float64_forward_of_exactly_what_was_shipped(name):
    batch = load_batch(LENET, "mnist5k", 16, name)
    dtype, shape = SHIPPED[name]
    assert batch.input_format is FORMATS[name]
    assert batch.images.dtype == dtype and batch.images.shape == (16, *shape) and batch.images.flags.c_contiguous
    np.testing.assert_array_equal(batch.images, batch.shipped[batch.idx])
    expected = reference_forward(batch.network, weights64(batch), batch.shipped[batch.idx].astype(np.float64))
    # float64 through BLAS: the cached reference was computed over the whole dataset, and a BLAS may block
    # (and so sum) a 5000-row product differently from a 16-row one: equal to ~1e-14, not to the bit. A
    # reference of the fp32 images where fp16 or u8 was shipped would differ by ~1e-4.
    np.testing.assert_allclose(batch.reference, expected, rtol=1e-12, atol=1e-12)


# -- fresh rounds ------------------------------------------------------------------------------
def test_u8_source_rounds_are_stored_digits_and_no_image_repeats_across_rounds_0_to_3():
    batch = load_batch(LENET, "mnist5k", 1000, "u8-source")
    rounds = [batch.round_images(r) for r in range(4)]
    for images in rounds:
        assert images.dtype == np.uint8 and images.shape == (1000, 1, 28, 28)
    np.testing.assert_array_equal(rounds[0][:, 0], batch.dataset.raw[batch.idx])
    flat = np.concatenate([images.reshape(len(images), -1) for images in rounds])
    assert len(np.unique(flat, axis=0)) == len(flat)


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_rounds_images_are_in_the_shipped_format_and_its_reference_is_their_forward(name):
    batch = load_batch(LENET, "mnist5k", 20, name)
    dtype, shape = SHIPPED[name]
    r = 2
    images = batch.round_images(r)
    assert images.dtype == dtype and images.shape == (20, *shape)
    assert not np.array_equal(images, batch.round_images(1))
    expected = reference_forward(batch.network, weights64(batch), images.astype(np.float64))
    np.testing.assert_array_equal(batch.round_reference(r), expected)
    assert np.mean(np.argmax(expected, 1) == batch.dataset.labels[batch.round_index(r)]) >= 0.9


def test_a_u8_source_digit_of_a_later_cycle_is_still_its_digit():
    batch = load_batch(LENET, "mnist5k", 50, "u8-source")
    r = 801  # positions 45000-45049: the ninth cycle of the dataset, its corners marked 9
    assert set(batch._positions(r)[0]) == {9} and batch.fresh_rounds_available >= r
    images, raw = batch.round_images(r), batch.dataset.raw[batch.round_index(r)][:, None]
    corners = (..., [0, 0, -1, -1], [0, -1, 0, -1])
    assert (images[corners] == 9).all() and (raw[corners] == 0).all()
    images[corners] = 0
    np.testing.assert_array_equal(images, raw)  # the digit itself where it was
    accuracy = np.mean(np.argmax(batch.round_reference(r), 1) == batch.dataset.labels[batch.round_index(r)])
    assert accuracy >= 0.9


# -- refused at plan time ------------------------------------------------------------------------
def sweep(tmp_path, **experiment):
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": {"e": {"variants": ["naive"], "batches": [100], "repeats": 1,
                                                          **experiment}}}))
    return path


def refusal(path) -> str:
    with pytest.raises(ConfigError) as refused:
        expand_config(load_config(path))
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_u8_source_from_the_random_dataset_is_refused_at_plan_time_in_one_line(tmp_path):
    path = sweep(tmp_path, dataset="random", input=["fp32", "u8-source"])
    assert re.match(rf"^{re.escape(str(path))}:\d+: experiments\.e\.input: input u8-source ships a dataset's stored "
                    r"images, upscaled on the GPU; dataset random has none \(use fp32, fp16 or u8\)$", refusal(path))


def test_u8_source_for_a_network_whose_input_is_not_one_square_channel_is_refused_in_one_line(tmp_path):
    path = sweep(tmp_path, network="networks/conv256.yaml", input=["u8-source"])
    assert re.match(rf"^{re.escape(str(path))}:\d+: experiments\.e\.input: input u8-source upscales one-channel "
                    r"square images on the GPU; conv256\.yaml takes input \[256, 228, 228\]$", refusal(path))
    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump({"name": "flat", "input": [784], "weights": "random",
                                    "layers": [{"name": "fc1", "type": "dense", "out_features": 10}]}))
    path = sweep(tmp_path, network=str(flat), input=["u8-source"])
    assert re.match(rf"^{re.escape(str(path))}:\d+: experiments\.e\.input: input u8-source upscales one-channel "
                    r"square images on the GPU; flat\.yaml takes input \[784\]$", refusal(path))


def test_fp16_and_u8_from_the_random_dataset_are_planned(tmp_path):
    jobs = expand_config(load_config(sweep(tmp_path, dataset="random", input=["fp32", "fp16", "u8"])))
    assert [job.input_format for job in jobs] == ["fp32", "fp16", "u8"]
    assert [job.job_id.split("-")[-2] for job in jobs] == ["pageable", "fp16", "u8"]  # fp32's id as before


def test_an_unknown_input_format_is_refused_by_the_schema_in_one_line(tmp_path):
    path = sweep(tmp_path, input=["int4"])
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert re.match(rf"^{re.escape(str(path))}:\d+: experiments\.e\.input\[0\]: expected one of \['fp32', 'fp16', 'u8', "
                    r"'u8-source'\], got \"int4\"$", str(refused.value)), str(refused.value)


# -- a job on the fake GPU -------------------------------------------------------------------------
def run(**over) -> RunSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}},
                batch=12, streams=1, host_memory="pageable", repeats=1, warmup=1, profiler="events")
    base.update(over)
    return RunSpec(**base)


@pytest.mark.parametrize("name, pixels", [("u8", 86 * 86), ("u8-source", 28 * 28)])
def test_a_job_on_the_fake_gpu_ships_its_format_and_scores_like_its_reference(name, pixels):
    spec = run(input_format=name)
    m = measure(spec, backend=FAKE)
    assert m.status == "ok", m.error
    batch = load_batch(LENET, "mnist5k", 12, name)
    labels = batch.dataset.labels[batch.idx]
    assert m.accuracy == pytest.approx(float(np.mean(np.argmax(batch.reference, 1) == labels)))
    assert m.images["input_bytes"] == 12 * pixels  # a byte a pixel crosses the bus
    # a fresh round was shipped, and checked, in the format too; so were the caching test's (3, more for short passes)
    assert m.integrity.fresh_passes == 1 and len(m.integrity.caching["times_ms"][0]) == m.integrity.caching["rounds"] >= 3
    assert m.integrity.freshness["share"] >= 0.99
    assert m.spec["input_format"] == name and f"-pageable-{name}-" in JobSpec.for_run(spec).job_id


def test_fp32_runs_keep_their_spec_and_run_key():
    fp32 = run(input_format="fp32")
    assert "input_format" not in fp32.to_dict() and fp32.run_key == run().run_key
    assert run(input_format="u8").run_key != fp32.run_key


# -- layers.cu ---------------------------------------------------------------------------------
@pytest.mark.parametrize("defines", [{}, {"CONV_T": "double"}], ids=["float", "double"])
def test_layers_cu_compiles_with_the_convert_and_upsample_kernels(defines):
    try:
        from convsweep.device.compile import LAYERS_SOURCE, compile_source, nvrtc_version

        nvrtc_version()
    except Exception as e:  # no cuda-python or no NVRTC library here
        pytest.skip(f"NVRTC is not available ({type(e).__name__}: {e})")
    build = compile_source(LAYERS_SOURCE, "layers", defines, "sm_90")
    assert build.cubin[:4] == b"\x7fELF"
    names = {k.name for k in build.kernels}
    assert {"convert_u8", "convert_f16", "convert_f32", "upsample_u8"} <= names
    assert {n for kind in LAYER_KINDS.values() for n in kind.kernels} <= names  # every kernel the runner looks up


def test_the_axis_and_the_formats_module_name_the_same_formats():
    """The `input` axis's schema enum (what a sweep may ask for) and convsweep.inputs.formats (what each one
    ships) list the same names in the same order: one cannot gain a format the other lacks."""
    from convsweep.base.axes import BY_NAME

    assert BY_NAME["input_format"].item_schema["enum"] == list(FORMATS)
