import copy

import pytest
import yaml

from convsweep.config import JobSpec, expand_config, load_config, validate
from convsweep.errors import ConfigError

BASE = {
    "experiments": {
        "e1": {"network": "networks/lenet86.yaml", "variants": ["naive"], "batches": [100, 1000]},
    }
}


def write(tmp_path, data, name="experiments.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_defaults_are_filled_from_the_schema(tmp_path):
    cfg = load_config(write(tmp_path, BASE))
    exp = cfg.experiments["e1"]
    assert exp["streams"] == [1] and exp["host_memory"] == ["pageable"]
    assert exp["repeats"] == 5 and exp["profiler"] == "nsys" and exp["dataset"] == "mnist5k"
    assert cfg.data["arch"] == "auto"


def test_matrix_is_the_product_of_the_axes(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=["naive", "reference"], streams=[1, 2], params={"naive": {"BLOCK": [128, 512]}})
    jobs = expand_config(load_config(write(tmp_path, data)))
    # naive: 2 params x 2 batches x 2 streams; reference: 2 batches x 2 streams
    assert len(jobs) == 8 + 4
    assert len({j.job_id for j in jobs}) == len(jobs)
    naive = [j for j in jobs if j.label == "naive"]
    assert {j.params["conv1"]["BLOCK"] for j in naive} == {128, 512}
    assert all(j.params["conv2"] == j.params["conv1"] for j in naive)


def test_chunk_size_is_an_axis_and_auto_keeps_the_old_keys(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(streams=[4], chunk_images=["auto", 250])
    jobs = expand_config(load_config(write(tmp_path, data)))
    assert sorted(str(j.chunk_images) for j in jobs) == ["250", "250", "None", "None"]
    auto = next(j for j in jobs if j.chunk_images is None)
    assert "chunk_images" not in auto.to_dict() and "-c" not in auto.job_id
    sized = next(j for j in jobs if j.chunk_images)
    assert "-s4-c250-" in sized.job_id and sized.to_dict()["chunk_images"] == 250
    data["experiments"]["e1"]["chunk_images"] = [0]
    with pytest.raises(ConfigError, match="chunk_images"):
        load_config(write(tmp_path, data))


def test_per_layer_variant_map(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["variants"] = [{"conv1": "naive", "conv2": "naive"}]
    jobs = expand_config(load_config(write(tmp_path, data)))
    assert jobs[0].variants == {"conv1": "naive", "conv2": "naive"}


def test_job_ids_are_stable_and_change_with_the_spec(tmp_path):
    a = expand_config(load_config(write(tmp_path, BASE)))
    b = expand_config(load_config(write(tmp_path, BASE)))
    assert [j.job_id for j in a] == [j.job_id for j in b]
    spec = a[0].to_dict()
    assert JobSpec.from_dict(spec).run_key == a[0].run_key
    assert JobSpec.from_dict({**spec, "repeats": 7}).run_key != a[0].run_key


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["experiments"]["e1"].update(batchez=[1]), "experiments.e1: unknown key ('batchez' was unexpected)"),
    (lambda d: d["experiments"]["e1"].update(batches="100"), "experiments.e1.batches: expected array"),
    (lambda d: d["experiments"]["e1"].update(batches=[0]), "experiments.e1.batches[0]"),
    (lambda d: d["experiments"]["e1"].update(host_memory=["paged"]), "expected one of ['pageable', 'pinned', 'registered']"),
    (lambda d: d["experiments"]["e1"].update(profiler="ncu"), "experiments.e1.profiler: expected one of"),
    (lambda d: d["experiments"]["e1"].update(batches=[]), "experiments.e1.batches: must not be empty"),
    (lambda d: d.update(experiments={}), "experiments: must not be empty"),
    (lambda d: d.update(colour="red"), "(top level): unknown key"),
])
def test_bad_config_gives_one_line_with_file_and_key(tmp_path, mutate, expected):
    data = copy.deepcopy(BASE)
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message


@pytest.mark.parametrize("mutate, expected", [
    (lambda e: e.update(variants=["nieve"]), "unknown variant 'nieve'"),
    (lambda e: e.update(variants=[{"conv1": "naive"}]), "no variant for layer 'conv2'"),
    (lambda e: e.update(variants=[{"conv1": "naive", "conv2": "naive", "conv9": "naive"}]), "unknown layer 'conv9'"),
    (lambda e: e.update(params={"naive": {"TILE": [8]}}), "params.naive.TILE: variant 'naive' has no tunable 'TILE'"),
    (lambda e: e.update(params={"naive": {"BLOCK": [7]}}), "params.naive.BLOCK: 7 is not an allowed value"),
    (lambda e: e.update(params={"naive": {"BLOCK": [256, 2048]}}), "2048 is not an allowed value"),
    (lambda e: e.update(params={"naiv": {"BLOCK": [64]}}), "params.naiv: unknown variant"),
    (lambda e: e.update(network="networks/fp64_stride5.yaml", variants=["register_tiled_gemm"]),
     "variants[0]: variant 'register_tiled_gemm' computes float32, but fp64_stride5.yaml is float64"),
])
def test_matrix_errors_name_the_key(tmp_path, mutate, expected):
    data = copy.deepcopy(BASE)
    mutate(data["experiments"]["e1"])
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        expand_config(load_config(write(tmp_path, data)))


def test_restrictions_filter_the_grid_and_can_empty_it():
    from convsweep.variants import Variant

    tiles = {"TX": {"default": 16, "values": [8, 16, 32]}, "TY": {"default": 16, "values": [8, 16, 32]}}
    var = Variant(name="tiled", precision="fp32", description="", params=tiles, restrictions=("TX * TY <= 256",))
    combos = var.param_combinations({"TX": [16], "TY": [8, 16, 32]}, "p")
    assert [c["TY"] for c in combos] == [8, 16]
    assert len(var.all_combinations()) == 6  # of 9, the three with more than 256 threads are left out
    with pytest.raises(ConfigError, match="no combination"):
        var.param_combinations({"TX": [32], "TY": [32]}, "params.tiled")


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"experiments.yaml:\d+: not valid YAML"):
        load_config(write(tmp_path, "experiments: [\n  - a: b\n c"))


def test_validate_fills_defaults_in_place():
    data = copy.deepcopy(BASE)
    validate(data, "x.yaml")
    assert data["db_url"] == "sqlite:///db/results.sqlite"


def test_the_default_experiments_file_is_valid():
    from convsweep.config import ROOT

    jobs = expand_config(load_config(ROOT / "experiments.yaml"))
    assert {j.label for j in jobs} == {"naive", "fused_conv_relu_pool", "tf32_sliding_window", "fp16_sliding_window", "reference"}
    assert sorted({j.batch for j in jobs}) == [100, 1000, 10000]
