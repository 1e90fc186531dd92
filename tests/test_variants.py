import os
import re

import pytest

from convsweep.model.checks import TOLERANCE
from convsweep.base.errors import ConfigError, ShapeError
from convsweep.base.expr import evaluate
from convsweep.model.layers import LAYER_KINDS
from convsweep.base.paths import REGISTRY_PATH
from convsweep.base.schema import load_schema
from convsweep.model.variants import DTYPES, WORKSPACE_CAP_BYTES, ConvShape, Variant, load_registry
from convsweep.base.yamlio import read_yaml_file


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


def test_a_workspace_over_the_cap_is_refused_and_im2col_at_batch_10000_is_under_it():
    import dataclasses

    im2col = next(v for v in load_registry().values() if v.workspace and "C * K * K * B" in v.workspace)
    conv2 = ConvShape(B=10000, C=4, M=16, H=40, W=40, K=7)
    assert 9e9 < im2col.workspace_bytes(conv2, im2col.defaults()) < WORKSPACE_CAP_BYTES
    greedy = dataclasses.replace(im2col, workspace="2 * B * 2**30")
    with pytest.raises(ShapeError, match=r"workspace \(21474836480 bytes .*\) is over the cap of 16 GiB"):
        greedy.workspace_bytes(ConvShape(B=10, C=4, M=16, H=40, W=40, K=7), greedy.defaults())


def test_registry_is_complete():
    registry = load_registry()
    assert {"naive", "reference"} <= set(registry)
    for name, var in registry.items():
        assert var.precision in ("fp32", "tf32", "fp16")
        if not var.is_cpu:
            assert var.source.is_file() and var.launches, name


LAUNCH = "launches: [{kernel: k, grid: [1], block: [1]}]"


@pytest.mark.parametrize("text, expected", [
    # checked by workflow/schemas/variants.schema.yaml
    (f"a: {{precision: fp64, source: x.cu, {LAUNCH}}}", "a.precision: expected one of ['fp32', 'tf32', 'fp16'], got \"fp64\""),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, colour: 1}}", "a.colour: unknown key"),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, dtypes: [int8]}}", "a.dtypes[0]: expected one of ['float32', 'float64']"),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, fuses: [maxpool]}}", 'a.fuses[0]: expected "relu", got "maxpool"'),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, compile_time: [B]}}",
     "a.compile_time[0]: expected a shape name (C, M, H, W, K, S, P, PS, "
     "a later layer's M2, K2, S2, P2, PS2, N1, ..., or an absorbed layer's SRC_H, SRC_W), never B, got \"B\""),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, params: {{T: [1, 2]}}}}", "a.params.T: expected object, got [1, 2]"),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, params: {{T: {{default: 1}}}}}}", "a.params.T: 'values' is a required property"),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, min_cc: '8.0'}}", "a.min_cc: expected number, got \"8.0\""),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, restrictions: 'T < 3'}}", "a.restrictions: expected array"),
    ("a: {precision: fp32, source: x.cu}", "a: 'launches' is a required property"),
    ("a: {precision: fp32, launches: []}", "a: 'source' is a required property"),
    ("a: {precision: fp32, source: x.cu, launches: []}", "a.launches: must not be empty"),
    ("a: {precision: fp32, source: x.cu, launches: [{kernel: k, grid: [1, 1, 1, 1], block: [1]}]}",
     "a.launches[0].grid: expected at most 3 items, got 4"),
    ("a: {precision: fp32, source: x.cu, launches: [{kernel: k, grid: [1], block: [1], shared: 4}]}",
     "a.launches[0].shared: unknown key; did you mean 'shared_bytes'?"),
    ("a: {precision: fp32, source: x.cu, launches: [{grid: [1], block: [1]}]}", "a.launches[0]: 'kernel' is a required property"),
    ("a: {cpu: true}", "a: 'precision' is a required property"),
    ("", "(top level): expected object, got null"),
    # checked in code: what the schema cannot see
    (f"a: {{precision: fp32, source: nope.cu, {LAUNCH}}}", "a.source: expected an existing .cu file"),
    (f"a: {{precision: fp32, source: x.cu, {LAUNCH}, params: {{T: {{default: 3, values: [1, 2]}}}}}}",
     "a.params.T.default: expected one of [1, 2], got 3"),
])
def test_bad_registry_entries_are_one_line_naming_file_and_key(tmp_path, text, expected):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "x.cu").write_text("")
    path = kernels / "variants.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_registry(path)
    message = str(info.value)
    assert "\n" not in message
    # The schema's errors name the file as the checkout knows it (here: absolute) and the line (an empty
    # file has none); the two checks in code name it bare.
    in_code = expected.startswith(("a.source:", "a.params.T.default:"))
    shown = "variants.yaml: " if in_code else f"{path}:1: " if text else f"{path}: "
    assert message.startswith(shown + expected), message


def test_a_checked_registry_is_remembered_until_it_or_its_schema_changes(tmp_path, monkeypatch):
    """A job process re-reading an unchanged registry skips jsonschema; an edit is checked again."""
    from convsweep.base import schema

    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "variants.yaml"
    path.write_text("ref: {cpu: true, precision: fp32}\n")
    first = schema.validated_file(path, "variants")
    assert first["ref"]["params"] == {}  # with the schema's defaults filled in

    def no_validation(*args, **kwargs):
        cache = tmp_path / "cache"
        held = sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else "no cache directory"
        raise AssertionError(f"validated again; the cache holds {held}")

    monkeypatch.setattr(schema, "validate", no_validation)
    assert schema.validated_file(path, "variants") == first
    path.write_text("ref: {cpu: true, precision: fp33}\n")
    monkeypatch.undo()
    monkeypatch.setenv("CONVSWEEP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:1: ref.precision: expected one of"):
        schema.validated_file(path, "variants")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:1: ref.precision"):  # never remembered
        schema.validated_file(path, "variants")


def test_a_cpu_variant_takes_the_schema_defaults(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_text("ref: {cpu: true, precision: fp32}\n")
    assert load_registry(path)["ref"] == Variant(name="ref", precision="fp32", description="")


def test_the_schema_defaults_leave_launches_and_params_as_written():
    """A Variant's launches and params are what the registry says (its hash keys compile jobs)."""
    raw = read_yaml_file(REGISTRY_PATH)
    for name, var in load_registry().items():
        assert var.launches == tuple(raw[name].get("launches", ())), name
        assert var.params == raw[name].get("params", {}), name


def test_schema_enums_agree_with_the_code():
    entry = load_schema("variants")["$defs"]["variant"]["properties"]
    assert entry["precision"]["enum"] == list(TOLERANCE)
    assert entry["dtypes"]["items"]["enum"] == list(DTYPES)
    fuse_names = {kind.fuse_name for kind in LAYER_KINDS.values()} - {None}
    own, tail = entry["fuses"]["anyOf"]
    assert {name for fuses in own["enum"] for name in fuses} == fuse_names
    # a fused network may name every layer type (a conv's fuse_name is its type)
    assert set(tail["items"]["enum"]) == {kind.fuse_name or name for name, kind in LAYER_KINDS.items()}


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


def test_a_huge_power_in_a_registry_expression_is_one_line(tmp_path):
    import time

    path = tmp_path / "variants.yaml"
    (tmp_path / "x.cu").write_text("")
    path.write_text(f"a: {{precision: fp32, source: x.cu, {LAUNCH}, params: {{T: {{default: 1, values: [1, 2]}}}}, "
                    "restrictions: ['T < 9**9**9**9']}\n")
    variant = load_registry(path)["a"]
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^variants\.yaml: a\.restrictions: 'T < 9\*\*9\*\*9\*\*9' computes a number "
                                          r"beyond 2\*\*63$"):
        variant.param_combinations({"T": [1, 2]}, "p")
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host


def test_a_duplicate_key_in_the_registry_is_an_error_with_its_line(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_text("ref: {cpu: true, precision: fp32}\nnaive: {cpu: true, precision: fp32}\n"
                    "ref: {cpu: true, precision: fp16}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: duplicate key 'ref'$"):
        load_registry(path)


def test_a_grid_of_ten_to_the_ten_settings_is_refused_before_it_is_enumerated():
    import time

    tunables = {f"T{i}": {"default": 0, "values": list(range(10))} for i in range(10)}
    wide = Variant(name="wide", precision="fp32", description="", params=tunables)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^params\.wide: the grid holds 10,000,000,000 settings \(the product of its "
                                          r"value lists\); a job measures at most 10,000$"):
        wide.param_combinations({name: spec["values"] for name, spec in tunables.items()}, "params.wide")
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host


# -- registries of one's own: $CONVSWEEP_VARIANTS ---------------------------------------------------
def own_registry(directory, text: str, sources=("mine.cu",)):
    """A variants.yaml in `directory` with the .cu files it names beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in sources:
        (directory / source).write_text("")
    path = directory / "variants.yaml"
    path.write_text(text)
    return path


def test_a_registry_named_in_the_environment_joins_the_shipped_one(tmp_path, monkeypatch):
    from convsweep.model.variants import VARIANTS_ENV, get_variant

    path = own_registry(tmp_path / "mykernels", f"mine: {{precision: fp32, source: mine.cu, {LAUNCH}}}\n")
    monkeypatch.setenv(VARIANTS_ENV, str(path))
    registry = load_registry()
    assert {"naive", "reference", "mine"} <= set(registry)
    assert registry["mine"].source == path.parent / "mine.cu"  # beside its own registry, not in kernels/
    assert get_variant("mine") is registry["mine"]


def test_the_environment_is_part_of_the_registry_cache_key(tmp_path, monkeypatch):
    from convsweep.model.variants import VARIANTS_ENV

    first = own_registry(tmp_path / "a", f"first: {{precision: fp32, source: mine.cu, {LAUNCH}}}\n")
    second = own_registry(tmp_path / "b", f"second: {{precision: fp32, source: mine.cu, {LAUNCH}}}\n")
    monkeypatch.delenv(VARIANTS_ENV, raising=False)
    assert not {"first", "second"} & set(load_registry())
    monkeypatch.setenv(VARIANTS_ENV, str(first))
    assert "first" in load_registry() and "second" not in load_registry()
    # several files, os.pathsep-separated; empty entries (a trailing separator) are nothing
    monkeypatch.setenv(VARIANTS_ENV, os.pathsep.join([str(first), "", str(second), ""]))
    assert {"first", "second"} <= set(load_registry())
    monkeypatch.delenv(VARIANTS_ENV)
    assert not {"first", "second"} & set(load_registry())


def test_a_relative_path_in_the_environment_is_taken_from_the_current_directory(tmp_path, monkeypatch):
    from convsweep.model.variants import VARIANTS_ENV

    own_registry(tmp_path / "mykernels", f"mine: {{precision: fp32, source: mine.cu, {LAUNCH}}}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(VARIANTS_ENV, os.path.join("mykernels", "variants.yaml"))
    assert load_registry()["mine"].source == tmp_path / "mykernels" / "mine.cu"


@pytest.mark.parametrize("text, expected", [
    (f"naive: {{precision: fp32, source: mine.cu, {LAUNCH}}}",
     "naive: expected a name of its own, got one kernels/variants.yaml defines already"),
    (f"a: {{precision: fp64, source: mine.cu, {LAUNCH}}}", "a.precision: expected one of ['fp32', 'tf32', 'fp16']"),
    (f"a: {{precision: fp32, source: other.cu, {LAUNCH}}}", "a.source: expected an existing .cu file in mykernels/"),
])
def test_a_bad_registry_of_ones_own_is_one_line_naming_its_file_and_key(tmp_path, monkeypatch, text, expected):
    from convsweep.model.variants import VARIANTS_ENV

    path = own_registry(tmp_path / "mykernels", text)
    monkeypatch.setenv(VARIANTS_ENV, str(path))
    with pytest.raises(ConfigError) as info:
        load_registry()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}{':1' if 'precision' in expected else ''}: {expected}"), message  # schema: line


def test_a_name_two_registries_of_ones_own_define_is_refused(tmp_path, monkeypatch):
    from convsweep.model.variants import VARIANTS_ENV

    entry = f"mine: {{precision: fp32, source: mine.cu, {LAUNCH}}}\n"
    first, second = own_registry(tmp_path / "a", entry), own_registry(tmp_path / "b", entry)
    monkeypatch.setenv(VARIANTS_ENV, os.pathsep.join([str(first), str(second)]))
    expected = rf"^{re.escape(str(second))}: mine: expected a name of its own, got one {re.escape(str(first))} defines"
    with pytest.raises(ConfigError, match=expected):
        load_registry()


def test_a_missing_registry_in_the_environment_names_the_variable_and_the_file(tmp_path, monkeypatch):
    from convsweep.model.variants import VARIANTS_ENV

    missing = tmp_path / "nowhere" / "variants.yaml"
    monkeypatch.setenv(VARIANTS_ENV, str(missing))
    with pytest.raises(ConfigError, match=rf"^CONVSWEEP_VARIANTS: expected existing variants.yaml files, "
                                          rf"got '{re.escape(str(missing))}' \(no such file\)$"):
        load_registry()


# -- issue 54: the registry's errors name their line; an unknown name, the nearest ones ------------------

BLOCK_STYLE = """\
a:
  precision: fp32
  source: mine.cu
  launches: [{kernel: k, grid: [1], block: [1]}]
b:
  precision: fp32
  source: mine.cu
  launches:
    - {kernel: k, grid: [1], block: [1]}
"""


@pytest.mark.parametrize("old, new, expected", [
    ("  source: mine.cu\n  launches: [", "  source: mine.cu\n  fusez: [relu]\n  launches: [",
     "4: a.fusez: unknown key; did you mean 'fuses'?"),
    ("b:\n  precision: fp32", "b:\n  precision: fp23",
     "6: b.precision: expected one of ['fp32', 'tf32', 'fp16'], got \"fp23\"; did you mean 'fp32'?"),
    ("    - {kernel: k,", "    - {kernl: k,", "9: b.launches[0].kernl: unknown key; did you mean 'kernel'?"),
])
def test_a_registry_error_names_its_line(tmp_path, monkeypatch, old, new, expected):
    from convsweep.model.variants import VARIANTS_ENV

    assert old in BLOCK_STYLE
    path = own_registry(tmp_path / "mykernels", BLOCK_STYLE.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_registry(path)
    assert str(info.value) == f"{path}:{expected}"
    monkeypatch.setenv(VARIANTS_ENV, str(path))  # one's own registry: the same line, named by its path
    with pytest.raises(ConfigError) as info:
        load_registry()
    assert str(info.value) == f"{path}:{expected}"


def test_an_unknown_variant_is_the_nearest_names_or_where_they_are_listed(tmp_path, monkeypatch):
    from convsweep.model.variants import VARIANTS_ENV, get_variant, unknown_variant

    registry = load_registry()
    with pytest.raises(ConfigError, match=r"^variants\.yaml: unknown variant 'naiv'; did you mean 'naive'\?$"):
        get_variant("naiv")
    with pytest.raises(ConfigError) as info:
        get_variant("qqqqzzzz")
    assert str(info.value) == \
        f"variants.yaml: unknown variant 'qqqqzzzz' ({len(registry)} known: see kernels/variants.yaml)"
    assert unknown_variant("tf32_sliding", registry) == \
        "unknown variant 'tf32_sliding'; did you mean 'tf32_sliding_window' or 'tf32x3_sliding_window'?"
    mine = own_registry(tmp_path / "mine", f"mine: {{precision: fp32, source: mine.cu, {LAUNCH}}}\n")
    monkeypatch.setenv(VARIANTS_ENV, str(mine))
    assert unknown_variant("qqqqzzzz", load_registry()) == \
        f"unknown variant 'qqqqzzzz' ({len(registry) + 1} known: see kernels/variants.yaml and ${VARIANTS_ENV})"
