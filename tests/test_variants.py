import pytest

from convsweep.errors import ConfigError, ShapeError
from convsweep.expr import evaluate
from convsweep.variants import ConvShape, load_registry


def test_expressions_are_arithmetic_only():
    assert evaluate("ceil(W_out / 16) * B", {"W_out": 80, "B": 3}) == 15
    assert evaluate("min(K, 3) <= 3 and S == 1", {"K": 7, "S": 1}) is True
    assert evaluate(32, {}) == 32
    for bad in ("__import__('os')", "x.attr", "[1, 2]", "open('f')"):
        with pytest.raises(ConfigError):
            evaluate(bad, {"x": 1})
    with pytest.raises(ConfigError, match="unknown name 'Q'"):
        evaluate("Q + 1", {})


def test_lenet_shapes_and_floors():
    conv2 = ConvShape(B=10000, C=4, M=16, H=40, W=40, K=7)
    assert (conv2.H_out, conv2.W_out) == (34, 34)
    assert abs(conv2.flops / 1e9 - 72.5) < 0.05  # DESIGN.md: conv2 does 72.5 GFLOP at B=10000
    assert ConvShape(B=1, C=1, M=1, H=9, W=9, K=3, S=2).H_out == 4


def test_naive_launch_plan_covers_every_output():
    naive = load_registry()["naive"]
    shape = ConvShape(B=7, C=3, M=5, H=23, W=19, K=5)
    (launch,) = naive.launch_plan(shape, naive.defaults())
    threads, _, _ = launch.block
    blocks_per_plane = -(-shape.H_out * shape.W_out // threads)
    assert launch.grid == (shape.B * blocks_per_plane, shape.M, 1)
    assert launch.grid[0] * threads >= shape.B * shape.H_out * shape.W_out


def test_a_shape_a_variant_cannot_handle_is_refused_with_the_constraint():
    naive = load_registry()["naive"]
    with pytest.raises(ShapeError, match="larger than the 5x5 input"):
        naive.check_shape(ConvShape(B=1, C=1, M=1, H=5, W=5, K=7), naive.defaults())
    with pytest.raises(ShapeError, match=r"needs M <= 65535"):
        naive.check_shape(ConvShape(B=1, C=1, M=70000, H=9, W=9, K=3), naive.defaults())


def test_registry_is_complete():
    registry = load_registry()
    assert {"naive", "reference"} <= set(registry)
    for name, var in registry.items():
        assert var.precision in ("fp32", "tf32", "fp16")
        if not var.is_cpu:
            assert var.source.is_file() and var.launches, name


def test_bad_registry_entries_are_reported(tmp_path):
    (tmp_path / "x.cu").write_text("")
    cases = {
        "a: {precision: fp64, source: x.cu}": "a.precision: expected one of",
        "a: {precision: fp32, source: nope.cu}": "a.source: expected an existing .cu file",
        "a: {precision: fp32, source: x.cu, launches: [{kernel: k, grid: [1], block: [1]}], colour: 1}": "a.colour: unknown key",
        "a: {precision: fp32, source: x.cu, launches: [{kernel: k, grid: [1], block: [1]}], params: {T: {default: 3, values: [1, 2]}}}": "a.params.T",
        "a: {precision: fp32, source: x.cu, launches: [{kernel: k, grid: [1], block: [1]}], dtypes: [int8]}": "a.dtypes: expected names from",
        "a: {precision: fp32, source: x.cu, launches: [{kernel: k, grid: [1], block: [1]}], fuses: [maxpool]}": "a.fuses: expected a prefix",
    }
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"reg{i}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
            load_registry(path)


def test_fused_pool_and_dtype_shape_names():
    shape = ConvShape(B=2, C=4, M=16, H=40, W=40, K=7, P=4, PS=4, dtype="float64")
    names = shape.names()
    assert (names["H_out"], names["H_pool"], names["W_pool"], names["E"]) == (34, 8, 8, 8)
    assert shape.out_shape == (2, 16, 8, 8)
    assert shape.min_bytes == 8 * (2 * 4 * 40 * 40 + 16 * 4 * 49 + 16 + 2 * 16 * 8 * 8)
    plain = ConvShape(B=2, C=4, M=16, H=40, W=40, K=7)
    assert plain.out_shape == (2, 16, 34, 34) and plain.names()["P"] == 0


def test_dtype_and_fusion_mismatches_are_refused():
    registry = load_registry()
    naive, gemm = registry["naive"], registry["register_tiled_gemm"]
    double = ConvShape(B=1, C=1, M=10, H=100, W=100, K=5, S=5, dtype="float64")
    naive.check_shape(double, naive.defaults())
    assert naive.defines(naive.defaults(), double)["CONV_T"] == "double"
    assert "CONV_T" not in naive.defines(naive.defaults(), ConvShape(B=1, C=1, M=1, H=9, W=9, K=3))
    with pytest.raises(ShapeError, match="computes float32, not float64"):
        gemm.check_shape(double, gemm.defaults())
    with pytest.raises(ShapeError, match="needs no fused pool"):
        naive.check_shape(ConvShape(B=1, C=1, M=1, H=9, W=9, K=3, P=2, PS=2), naive.defaults())
