"""A conv variant absorbing the network's first layer (registry absorbs_input), without a GPU: the
plan (one step fewer, the conv step carrying that layer), the shape the kernel is built and launched
for (SRC_H, SRC_W, SRC_E), the bytes its floor counts, the arguments the runner hands it, the registry's
schema, and the refusals. fp16_fused_network absorbing input u8-source's upsample is the case; the
logits on a real GPU are in tests/test_absorbed_input_gpu.py.
"""
import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from convsweep.device.compile import compile_source
from convsweep.base.errors import ConfigError, ShapeError
from convsweep.inputs.formats import FORMATS
from convsweep.model.layers import LAYER_KINDS
from convsweep.measure.settings import _floor_shape, build_requests
from convsweep.model.network import load_network
from convsweep.base.paths import KERNELS_DIR, ROOT
from convsweep.base.schema import load_schema
from convsweep.model.variants import ConvShape, load_registry

LENET = load_network(ROOT / "networks/lenet86.yaml")
REGISTRY = load_registry()
FUSED = REGISTRY["fp16_fused_network"]
PIXELS = 86 * 86


def stored_digits(side: int = 28):
    """What FORMATS' network() reads of a dataset: its name and the stored images' shape."""
    return SimpleNamespace(name="mnist5k", raw=np.zeros((1, side, side), np.uint8))


U8_SOURCE = FORMATS["u8-source"].network(LENET, stored_digits())  # input (upsample 28x28 -> 86x86), conv1, ...
U8 = FORMATS["u8"].network(LENET, stored_digits())  # input (convert 86x86 bytes), conv1, ...


def plan(network, variant, absorbs=None):
    """(step layer, absorbed layer or None, fused count) of every step with `variant` at conv1."""
    steps = network.steps({"conv1": variant.fuses}, None if absorbs is None else {"conv1": absorbs})
    return [(s.layer.name, s.absorbed.name if s.absorbed else None, len(s.fused)) for s in steps]


# -- the plan ------------------------------------------------------------------------------------
def test_the_fused_network_absorbs_the_u8_source_upsample_into_its_conv_step():
    assert FUSED.absorbs_input == ("upsample",)
    assert plan(U8_SOURCE, FUSED, FUSED.absorbs_input) == [("conv1", "input", 9)]
    assert plan(U8_SOURCE, FUSED) == [("input", None, 0), ("conv1", None, 9)]  # nothing absorbed: as before


def test_steps_merge_only_for_an_absorbing_variant_and_the_kinds_it_lists():
    assert plan(U8, FUSED, FUSED.absorbs_input) == [("input", None, 0), ("conv1", None, 9)]  # convert: not listed
    assert plan(U8_SOURCE, FUSED, ("convert",)) == [("input", None, 0), ("conv1", None, 9)]
    assert plan(LENET, FUSED, FUSED.absorbs_input) == [("conv1", None, 9)]  # fp32: no first layer to absorb
    naive = REGISTRY["naive"]
    assert naive.absorbs_input == ()
    assert [s.layer.name for s in U8_SOURCE.steps({"conv1": (), "conv2": ()}, {"conv1": (), "conv2": ()})][:2] == \
        ["input", "conv1"]
    # only the conv right after the first layer can absorb it
    steps = U8_SOURCE.steps({"conv1": (), "conv2": ()}, {"conv2": ("upsample",)})
    assert steps[0].layer.name == "input" and all(s.absorbed is None for s in steps)


def test_the_conv_shape_names_the_shipped_source_and_the_build_compiles_it_in():
    absorbed = U8_SOURCE.variant_shape(U8_SOURCE.layer("conv1"), FUSED.fuses, 5, FUSED.absorbs_input)
    assert (absorbed.B, absorbed.C, absorbed.H, absorbed.W) == (5, 1, 86, 86)  # the conv's input is still 86x86
    assert (absorbed.SRC_H, absorbed.SRC_W, absorbed.SRC_E) == (28, 28, 1)
    (step,) = U8_SOURCE.steps({"conv1": FUSED.fuses}, {"conv1": FUSED.absorbs_input})
    assert U8_SOURCE.step_shape(step, 5) == absorbed  # what the runner launches is what a build is made for
    plain = U8_SOURCE.variant_shape(U8_SOURCE.layer("conv1"), FUSED.fuses, 5)
    assert (plain.SRC_H, plain.SRC_W, plain.SRC_E) == (0, 0, 0) and plain == LENET.variant_shape(LENET.layer("conv1"),
                                                                                               FUSED.fuses, 5)
    params = FUSED.defaults()
    defines = FUSED.defines(params, replace(absorbed, B=1))
    assert (defines["SRC_H_FIXED"], defines["SRC_W_FIXED"], defines["H_FIXED"]) == (28, 28, 86)
    plain_defines = FUSED.defines(params, replace(plain, B=1))
    assert (plain_defines["SRC_H_FIXED"], plain_defines["SRC_W_FIXED"]) == (0, 0)
    # the job's parallel compile asks for the build the runner then loads
    requests = build_requests(U8_SOURCE, {"conv1": FUSED}, SimpleNamespace(params={"conv1": {}}))
    assert dict(requests[-1].macros) == defines


def test_the_floor_and_the_plans_traffic_count_the_shipped_bytes_not_the_fp32_input():
    batch = 10_000
    absorbed = U8_SOURCE.variant_shape(U8_SOURCE.layer("conv1"), FUSED.fuses, batch, FUSED.absorbs_input)
    plain = U8_SOURCE.variant_shape(U8_SOURCE.layer("conv1"), FUSED.fuses, batch)
    assert plain.min_bytes - absorbed.min_bytes == batch * (4 * PIXELS - 28 * 28)
    assert absorbed.flops == plain.flops
    assert _floor_shape(U8_SOURCE, "conv1", FUSED, batch) == absorbed  # a job's floors
    assert _floor_shape(LENET, "conv1", FUSED, batch).min_bytes == plain.min_bytes

    def traffic(absorbs):  # as bench.report.network_traffic adds the steps' traffic up
        steps = U8_SOURCE.steps({"conv1": FUSED.fuses}, absorbs)
        return sum(s.layer.kind.traffic(U8_SOURCE, s, batch, 4)[0] for s in steps)

    # unabsorbed, upsample_u8 writes the fp32 input and the kernel reads it back: 8 bytes a pixel
    assert traffic({}) - traffic({"conv1": FUSED.absorbs_input}) == batch * 8 * PIXELS
    assert traffic({"conv1": FUSED.absorbs_input}) == absorbed.min_bytes


def test_shared_memory_shrinks_by_the_fp32_image_less_what_the_absorbed_upsample_keeps():
    absorbed = U8_SOURCE.variant_shape(U8_SOURCE.layer("conv1"), FUSED.fuses, 1, FUSED.absorbs_input)
    plain = U8_SOURCE.variant_shape(U8_SOURCE.layer("conv1"), FUSED.fuses, 1)
    (a,), (p,) = FUSED.launch_plan(absorbed, FUSED.defaults()), FUSED.launch_plan(plain, FUSED.defaults())
    # the fp32 image, against its bytes, 256 quotients, 86 + 86 taps and 28 rows blended to 86 columns
    assert p.shared_bytes - a.shared_bytes == 4 * PIXELS - (28 * 28 + 4 * 256 + 16 * (86 + 86) + 4 * 28 * 86)


# -- the runner ------------------------------------------------------------------------------------
class RecordingOp:
    def __init__(self):
        self.calls = []

    def enqueue(self, stream, y, x, shape, workspace=None, absorbed_args=()):
        self.calls.append((x, shape, absorbed_args))


@pytest.mark.parametrize("absorbs", [True, False])
def test_the_absorbing_step_gets_the_shipped_batch_and_the_upsamples_arguments(absorbs):
    steps = U8_SOURCE.steps({"conv1": FUSED.fuses}, {"conv1": FUSED.absorbs_input if absorbs else ()})
    step = steps[0 if absorbs else 1]
    op = RecordingOp()
    runner = SimpleNamespace(convs={"conv1": op}, shape=U8_SOURCE.step_shape)
    x = SimpleNamespace(shape=(7, 1, 28, 28) if absorbs else (7, 1, 86, 86))  # the shipped bytes, or the fp32 input
    out = object()
    assert step.layer.kind.enqueue(runner, None, step, x, out, SimpleNamespace(workspaces={"conv1": None})) is out
    ((given, shape, args),) = op.calls
    assert given is x and shape.B == 7 and shape.SRC_H == (28 if absorbs else 0)
    if absorbs:  # exactly what _upsample_enqueue passes upsample_u8 after its sizes
        assert [type(a) for a in args] == [np.float64, np.float64, np.float32]
        assert args == (np.float64(28 / 86), np.float64(28 / 86), np.float32(255.0))
    else:
        assert args == ()


def test_a_variant_that_absorbs_but_cannot_is_refused_at_plan_time_naming_the_constraint(monkeypatch):
    odd = FORMATS["u8-source"].network(LENET, stored_digits(30))  # 900 bytes an image: not whole 16-byte chunks
    shape = odd.variant_shape(odd.layer("conv1"), FUSED.fuses, 1, FUSED.absorbs_input)
    with pytest.raises(ShapeError) as info:
        FUSED.check_shape(shape, FUSED.defaults())
    assert "\n" not in str(info.value) and str(info.value).endswith("needs SRC_H * SRC_W % 16 == 0")
    # the runner refuses it before it compiles the variant or allocates anything
    from convsweep.measure import runner

    monkeypatch.setattr(runner, "compile_source", lambda *args: None)
    gpu = SimpleNamespace(stream=lambda: None, arch="sm_90", module=lambda build, private=False: None,
                          kernel=lambda module, name: None)
    plan_ = runner.ConvPlan({"conv1": FUSED}, {"conv1": FUSED.defaults()}, "sm_90")
    with pytest.raises(ShapeError, match=re.escape("needs SRC_H * SRC_W % 16 == 0")):
        runner.GpuNetwork(gpu, odd, {}, plan_, 1, 8)
    # a variant absorbing nothing is not handed the shipped images
    naive = REGISTRY["naive"]
    with pytest.raises(ShapeError, match=r"computes from the network's input, not from the shipped 28x28 images"):
        naive.check_shape(ConvShape(B=1, C=1, M=4, H=86, W=86, K=7, SRC_H=28, SRC_W=28, SRC_E=1), naive.defaults())


# -- the registry --------------------------------------------------------------------------------
def test_the_schema_lists_exactly_the_layer_kinds_a_variant_may_absorb():
    entry = load_schema("variants")["$defs"]["variant"]["properties"]
    absorbable = {name for name, kind in LAYER_KINDS.items() if kind.absorbable}
    assert set(entry["absorbs_input"]["items"]["enum"]) == absorbable == {"convert", "upsample"}


@pytest.mark.parametrize("kinds, expected", [
    ("[relu]", "a.absorbs_input[0]: expected one of ['convert', 'upsample'], got \"relu\""),
    ("[pixelshuffle]", "a.absorbs_input[0]: expected one of ['convert', 'upsample'], got \"pixelshuffle\""),
    ("upsample", "a.absorbs_input: expected array, got \"upsample\""),
])
def test_the_registry_schema_rejects_a_kind_no_variant_may_absorb(tmp_path, kinds, expected):
    (tmp_path / "x.cu").write_text("")
    path = tmp_path / "variants.yaml"
    path.write_text(f"a: {{precision: fp32, source: x.cu, launches: [{{kernel: k, grid: [1], block: [1]}}], "
                    f"absorbs_input: {kinds}}}\n")
    with pytest.raises(ConfigError) as info:
        load_registry(path)
    assert "\n" not in str(info.value) and str(info.value).split("/")[-1].startswith(f"variants.yaml:1: {expected}"), str(info.value)


def test_absorbing_nothing_leaves_a_variants_entry_hash_as_it_was():
    naive = REGISTRY["naive"]
    assert replace(naive, absorbs_input=()).entry_hash == naive.entry_hash
    assert replace(FUSED, absorbs_input=()).entry_hash != FUSED.entry_hash  # what it builds changed: re-measured


# -- the kernel ------------------------------------------------------------------------------------
def device_function(path, name: str) -> str:
    """The text of a __device__ function in a .cu file, from its signature to its closing brace."""
    text = path.read_text()
    match = re.search(rf"__device__ __forceinline__ void {name}\(.*?\n}}\n", text, re.S)
    assert match, f"{path.name}: no {name}"
    return match.group(0)


def test_the_fused_kernels_bilinear_taps_are_layers_cus_verbatim():
    """The bit-for-bit claim rests on the same double-precision source positions as upsample_u8's."""
    assert device_function(KERNELS_DIR / "fp16_fused_network.cu", "bilinear_source") == \
        device_function(KERNELS_DIR / "layers.cu", "bilinear_source")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("absorbs", [True, False], ids=["absorbed", "fp32"])
def test_the_kernels_shared_memory_is_the_registrys_shared_bytes(tmp_path, arch, absorbs):
    """NVRTC compiles the kernel with a static_assert that its SHARED_BYTES equals the registry's
    expression (a launch with less leaves the logits poisoned; more wastes an SM's occupancy)."""
    network = U8_SOURCE if absorbs else LENET
    shape = network.variant_shape(network.layer("conv1"), FUSED.fuses, 1, FUSED.absorbs_input)
    params = FUSED.defaults()
    (launch,) = FUSED.launch_plan(shape, params)
    probe = tmp_path / "probe.cu"
    probe.write_text(f'#include "{KERNELS_DIR / "fp16_fused_network.cu"}"\n'
                     f'static_assert(SHARED_BYTES == {launch.shared_bytes}, "the registry\'s shared_bytes");\n')
    build = compile_source(probe, "probe", FUSED.defines(params, shape), arch)
    assert "network_forward" in {k.name for k in build.kernels}


@pytest.mark.parametrize("name", ["tf32_sliding_window", "fused_conv_relu_pool", "fp16_sliding_window"])
def test_a_pool_fusing_kernels_floor_counts_the_pooled_maps_it_writes(name):
    """Its floor is the work it does: the input read, weights and the pooled output written. Counted with the
    unpooled maps, conv1's floor at batch 10000 was 0.378 ms on the H100, above the 0.35 ms tf32_sliding_window
    took, and every fast setting of it came out suspect (sweeps/search.yaml on the lent H100)."""
    variant, batch = REGISTRY[name], 10_000
    conv1 = LENET.layer("conv1")
    floor = _floor_shape(LENET, "conv1", variant, batch)
    c, h, w = conv1.in_shape
    m, h_out, w_out = conv1.out_shape
    weights = m * c * conv1.kernel ** 2 + m
    itemsize = 4  # fp32 maps: the network's dtype
    assert floor.min_bytes == itemsize * (batch * c * h * w + weights + batch * m * (h_out // 2) * (w_out // 2))
    unfused = _floor_shape(LENET, "conv1", REGISTRY["naive"], batch)
    assert unfused.min_bytes - floor.min_bytes == itemsize * batch * m * (h_out * w_out - (h_out // 2) * (w_out // 2))
