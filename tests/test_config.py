import copy
import re

import pytest
import yaml

from convsweep.base.axes import AXES
from convsweep.sweep.config import JobSpec, expand_config, load_config, validate
from convsweep.base.errors import ConfigError
from convsweep.base.fileio import canonical_hash

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
    assert exp["repeats"] == "auto" and exp["profiler"] == "auto" and exp["dataset"] == "mnist5k"
    assert exp["stopping"] == {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.5, "timeout_s": 15,
                               "max_samples": 200}
    assert cfg.data["arch"] == "auto"


def test_repeats_auto_carries_its_stopping_rule_and_a_fixed_count_none(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["stopping"] = {"max_noise": 0.01}
    auto = expand_config(load_config(write(tmp_path, data)))[0]
    assert auto.repeats == "auto" and auto.stopping["max_noise"] == 0.01 and auto.stopping["min_samples"] == 10
    assert all(run.stopping == auto.stopping for run in auto.runs())
    data["experiments"]["e1"]["repeats"] = 5
    fixed = expand_config(load_config(write(tmp_path, data)))[0]
    assert fixed.stopping is None and "stopping" not in fixed.runs()[0].to_dict()  # fixed-count run keys unchanged
    data["experiments"]["e1"]["repeats"] = "often"
    with pytest.raises(ConfigError, match=r"experiments.e1.repeats"):
        load_config(write(tmp_path, data))


def test_matrix_is_the_product_of_the_axes(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=["naive", "reference"], streams=[1, 2], params={"naive": {"BLOCK": [128, 512]}})
    jobs = expand_config(load_config(write(tmp_path, data)))
    # A job per variant x batch x streams cell; naive's two BLOCK settings are measured inside its jobs.
    assert len(jobs) == 4 + 4
    assert len({j.job_id for j in jobs}) == len(jobs)
    naive = [j for j in jobs if j.label == "naive"]
    runs = [r for j in naive for r in j.runs()]
    assert len(runs) == 8 and {r.params["conv1"]["BLOCK"] for r in runs} == {128, 512}
    assert all(r.params["conv2"] == r.params["conv1"] for r in runs)  # a variant's grid ties its layers
    assert all(len(j.runs()) == 1 and j.runs()[0].params == {"conv1": {}, "conv2": {}} for j in jobs if j.label == "reference")
    assert len({r.run_key for j in jobs for r in j.runs()}) == 8 + 4  # every setting its own run


def test_per_layer_maps_multiply_their_variants_grids(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=[{"conv1": "naive", "conv2": "constant_weights"}],
                                     params={"naive": {"BLOCK": [128, 512]}, "constant_weights": {"BLOCK": [64, 256, 1024]}})
    job = expand_config(load_config(write(tmp_path, data)))[0]
    assert len(job.runs()) == 2 * 3 and job.settings().valid == 6
    assert {(r.params["conv1"]["BLOCK"], r.params["conv2"]["BLOCK"]) for r in job.runs()} == \
        {(a, b) for a in (128, 512) for b in (64, 256, 1024)}


def test_random_search_picks_a_seeded_sample_of_the_valid_settings(tmp_path):
    data = copy.deepcopy(BASE)
    grid = {"BLOCK_M": [4, 16, 64], "BLOCK_N": [128, 256], "BLOCK_K": [8, 16], "THREAD_M": [4, 8], "THREAD_N": [4, 8]}
    data["experiments"]["e1"].update(variants=["register_tiled_gemm"], params={"register_tiled_gemm": grid},
                                     search={"strategy": "random", "max_settings": 5, "seed": 3})
    jobs = expand_config(load_config(write(tmp_path, data)))
    picks = [[r.params for r in j.runs()] for j in jobs]
    assert len(jobs) == 2 and picks[0] == picks[1]  # the same sample at every batch
    assert len(picks[0]) == 5 and jobs[0].settings().valid == 12  # of the 12 the restrictions allow
    data["experiments"]["e1"]["search"]["seed"] = 4
    other = expand_config(load_config(write(tmp_path, data)))[0]
    assert [r.params for r in other.runs()] != picks[0] and other.job_id != jobs[0].job_id
    data["experiments"]["e1"]["search"]["max_settings"] = 500  # more than there are: all of them
    assert len(expand_config(load_config(write(tmp_path, data)))[0].runs()) == 12


def test_settings_that_do_not_fit_a_layer_are_left_out_of_a_grid(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=["tiled_shared"], params={"tiled_shared": {"TILE_W": [8, 32], "TILE_H": [4, 16]}})
    job = expand_config(load_config(write(tmp_path, data)))[0]
    assert 0 < len(job.runs()) == job.settings().valid <= 4


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


def test_cache_is_an_axis_of_gpu_cells_at_one_stream_and_warm_keeps_the_old_keys(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=["naive", "reference"], streams=[1, 2], batches=[100],
                                     cache=["warm", "cold"])
    jobs = expand_config(load_config(write(tmp_path, data)))
    cells = sorted((j.label, j.streams, j.cache) for j in jobs)
    # cold only where L2 is the GPU's and one stream runs the pass: a flush would hit other streams' kernels
    assert cells == [("naive", 1, "cold"), ("naive", 1, "warm"), ("naive", 2, "warm"),
                     ("reference", 1, "warm"), ("reference", 2, "warm")]
    cold = next(j for j in jobs if j.cache == "cold")
    assert "-pageable-cold-" in cold.job_id and cold.runs()[0].to_dict()["cache"] == "cold"
    warm = next(j for j in jobs if j.label == "naive" and j.streams == 1 and j.cache == "warm")
    assert "cache" not in warm.to_dict() and "cold" not in warm.job_id  # the keys warm runs had before
    assert cold.runs()[0].run_key != warm.runs()[0].run_key
    assert load_config(write(tmp_path, BASE)).experiments["e1"]["cache"] == ["warm"]
    data["experiments"]["e1"]["cache"] = ["lukewarm"]
    with pytest.raises(ConfigError, match=r"experiments.e1.cache\[0\]: expected one of \['warm', 'cold'\]"):
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
    assert JobSpec.from_dict(spec).job_key == a[0].job_key and JobSpec.from_dict(spec).job_id == a[0].job_id
    assert JobSpec.from_dict({**spec, "repeats": 7}).job_key != a[0].job_key
    # A setting's run_key is the spec of that setting alone: the one the runs of this cell had before
    # jobs measured grids (so their history in the store goes on).
    run = a[0].runs()[0]
    assert run.run_key == canonical_hash({**{k: v for k, v in spec.items() if k not in ("grid", "search")},
                                          "params": {"conv1": {"BLOCK": 256}, "conv2": {"BLOCK": 256}}})



def test_a_variants_tunables_can_be_set_per_layer(tmp_path):
    """Each layer at its own best setting: conv1 one value, conv2 a grid of two; a layer not named keeps
    the registry's defaults; the shared form of before keeps its job keys."""
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=["naive"], batches=[100],
                                     params={"naive": {"conv1": {"BLOCK": 128}, "conv2": {"BLOCK": [64, 512]}}})
    job = expand_config(load_config(write(tmp_path, data)))[0]
    assert job.grid == [{"layers": ["conv1"], "values": {"BLOCK": [128]}},
                        {"layers": ["conv2"], "values": {"BLOCK": [64, 512]}}]
    assert sorted((r.params["conv1"]["BLOCK"], r.params["conv2"]["BLOCK"]) for r in job.runs()) == [(128, 64), (128, 512)]
    data["experiments"]["e1"]["params"] = {"naive": {"conv2": {"BLOCK": 512}}}
    only_conv2 = expand_config(load_config(write(tmp_path, data)))[0]
    assert [(r.params["conv1"]["BLOCK"], r.params["conv2"]["BLOCK"]) for r in only_conv2.runs()] == [(256, 512)]
    data["experiments"]["e1"]["params"] = {"naive": {"BLOCK": [128]}}
    shared = expand_config(load_config(write(tmp_path, data)))[0]
    assert shared.grid == [{"layers": ["conv1", "conv2"], "values": {"BLOCK": [128]}}]


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["experiments"]["e1"].update(batchez=[1]), "experiments.e1.batchez: unknown key; did you mean 'batches'?"),
    (lambda d: d["experiments"]["e1"].update(batches="100"), "experiments.e1.batches: expected array"),
    (lambda d: d["experiments"]["e1"].update(batches=[0]), "experiments.e1.batches[0]"),
    (lambda d: d["experiments"]["e1"].update(host_memory=["paged"]), "expected one of ['pageable', 'pinned', 'registered']"),
    (lambda d: d["experiments"]["e1"].update(profiler="ncu"), "experiments.e1.profiler: expected one of"),
    (lambda d: d["experiments"]["e1"].update(batches=[]), "experiments.e1.batches: must not be empty"),
    (lambda d: d.update(experiments={}), "experiments: must not be empty"),
    (lambda d: d.update(colour="red"), ":1: colour: unknown key"),
    (lambda d: d["experiments"]["e1"].update(params={"naive": {"BLOCK": 64}}),
     "experiments.e1.params.naive.BLOCK: expected a list of the tunable's values or a conv layer's own tunables"),
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
    (lambda e: e.update(params={"naive": {"conv2": {"BLOCK": 7}}}), "params.naive.conv2.BLOCK: 7 is not an allowed value"),
    (lambda e: e.update(params={"naive": {"conv1": {"BLOK": 64}}}), "params.naive.conv1.BLOK: variant 'naive' has no"),
    (lambda e: e.update(params={"naive": {"conv1": {"BLOCK": 64}, "BLOCK": [128]}}),
     "params.naive: give tunables (BLOCK) either for all layers or under each conv layer (conv1), not both"),
    (lambda e: e.update(network="networks/fp64_stride5.yaml", variants=["register_tiled_gemm"]),
     "variants[0]: variant 'register_tiled_gemm' computes float32, but fp64_stride5.yaml is float64"),
])
def test_matrix_errors_name_the_key(tmp_path, mutate, expected):
    data = copy.deepcopy(BASE)
    mutate(data["experiments"]["e1"])
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        expand_config(load_config(write(tmp_path, data)))


def test_restrictions_filter_the_grid_and_can_empty_it():
    from convsweep.model.variants import Variant

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
    from convsweep.sweep.config import ROOT

    jobs = expand_config(load_config(ROOT / "experiments.yaml"))
    assert {j.label for j in jobs} == {"naive", "fused_conv_relu_pool", "tf32_sliding_window", "fp16_sliding_window",
                                      "fp16_fused_network", "wgmma_fused_network", "reference"}
    assert sorted({j.batch for j in jobs}) == [100, 1000, 10000]


def test_a_fused_network_covers_the_conv_layers_it_swallows(tmp_path):
    """variants: [fp16_fused_network] maps conv1 alone (its kernel computes conv2); a mapping may
    leave conv2 out, and one that gives conv2 another variant is one line naming the layer."""
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["variants"] = ["fp16_fused_network", {"conv1": "fp16_fused_network"}]
    jobs = expand_config(load_config(write(tmp_path, data)))
    assert {tuple(job.variants.items()) for job in jobs} == {(("conv1", "fp16_fused_network"),)}
    data["experiments"]["e1"]["variants"] = [{"conv1": "fp16_fused_network", "conv2": "naive"}]
    with pytest.raises(ConfigError) as info:
        expand_config(load_config(write(tmp_path, data)))
    assert "variants[0].conv2: layer conv2 is computed by conv1's variant 'fp16_fused_network'" in str(info.value)
    data["experiments"]["e1"]["variants"] = [{"conv1": "naive", "conv2": "fp16_fused_network"}]
    with pytest.raises(ConfigError, match="layer conv2 is followed by relu, maxpool, flatten"):
        expand_config(load_config(write(tmp_path, data)))


SHELL_PATH = "expected a path of letters, digits and _ . / + = : @ - (no spaces or shell characters)"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d.update(results_dir="r;touch pwned;"), f'results_dir: {SHELL_PATH}, got "r;touch pwned;"'),
    (lambda d: d.update(results_dir="x$(touch pwned)"), f'results_dir: {SHELL_PATH}, got "x$(touch pwned)"'),
    (lambda d: d.update(results_dir="-rf"), f'results_dir: {SHELL_PATH}, got "-rf"'),
    (lambda d: d.update(results_dir="my results"), f'results_dir: {SHELL_PATH}, got "my results"'),
    (lambda d: d.update(results_dir="r/{experiment}"), f'results_dir: {SHELL_PATH}, got "r/{{experiment}}"'),
    (lambda d: d.update(results_dir="r\nx"), f'results_dir: {SHELL_PATH}, got "r\\nx"'),
    (lambda d: d.update(bench="b|c.json"), f'bench: {SHELL_PATH}, got "b|c.json"'),
    (lambda d: d["experiments"]["e1"].update(network="networks/`id`.yaml"),
     f'experiments.e1.network: {SHELL_PATH}, got "networks/`id`.yaml"'),
    (lambda d: d["experiments"]["e1"].update(dataset={"name": "f", "images": "a&b", "labels": "l"}),
     f'experiments.e1.dataset.images: {SHELL_PATH}, got "a&b"'),
    (lambda d: d.update(db_url="sqlite:///x.db;rm -rf ~"), 'db_url: expected a URL scheme://... of letters, digits'),
    (lambda d: d.update(db_url="/tmp/x.db"), 'db_url: expected a URL scheme://...'),
])
def test_paths_refuse_shell_characters(tmp_path, mutate, expected):
    data = copy.deepcopy(BASE)
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: {re.escape(expected)}", str(info.value)), str(info.value)


def test_paths_and_urls_that_are_plain_pass(tmp_path):
    data = copy.deepcopy(BASE)
    data.update(results_dir="out/run-1+x=y@z", db_url="postgresql+psycopg://u:p%40ss@db:5432/c?sslmode=require&a=b")
    assert load_config(write(tmp_path, data)).results_dir == "out/run-1+x=y@z"


def test_a_config_override_goes_through_the_same_check(tmp_path):
    """`snakemake --config results_dir='x$(touch pwned)'` reaches SweepPlan as the merged config dict."""
    from convsweep.app.plan import SweepPlan

    path = write(tmp_path, BASE)
    config = {**yaml.safe_load(path.read_text()), "results_dir": "x$(touch pwned)"}
    with pytest.raises(ConfigError) as info:
        SweepPlan(copy.deepcopy(config), path)
    assert str(info.value) == f'{path}: results_dir: {SHELL_PATH}, got "x$(touch pwned)"'
    with pytest.raises(ConfigError, match="results_dir: expected a path"):
        validate(copy.deepcopy(config), "overrides")


DUPLICATED = """\
experiments:
  lenet86-baseline:
    variants: [naive]
    batches: [100]
  lenet86-cache:
    variants: [naive]
    batches: [100]
  lenet86-baseline:
    variants: [reference]
    batches: [1000]
"""


def test_a_duplicate_experiment_name_is_an_error_with_its_line(tmp_path):
    path = write(tmp_path, DUPLICATED)
    with pytest.raises(ConfigError, match=rf"^{path}:8: duplicate key 'lenet86-baseline'$"):
        load_config(path)
    # Snakemake's loader keeps the second; SweepPlan's validate reads the file again and refuses it.
    with pytest.raises(ConfigError, match=rf"^{path}:8: duplicate key 'lenet86-baseline'$"):
        validate(yaml.safe_load(DUPLICATED), str(path))


def alias_bomb() -> str:
    lines = ["experiments:", "  e1:", "    variants: [naive]", "    batches: [100]", "    params:",
             '      a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 9):
        previous = "a" if level == 1 else f"l{level - 1}"
        lines.append(f"      l{level}: &l{level} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_quickly_however_the_sweep_is_read(tmp_path):
    import time

    from convsweep.app.plan import SweepPlan

    path = write(tmp_path, alias_bomb())
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"^{path}:11: YAML aliases from here expand to more than 100,000 values$"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"^{path}:11: YAML aliases"):  # as the Snakefile sees it
        SweepPlan(yaml.safe_load(path.read_text()), path)
    with pytest.raises(ConfigError, match=r"^x.yaml: experiments.e1.params.l4: more than 20,000 values"):
        validate(yaml.safe_load(path.read_text()), "x.yaml")  # no file to read again: the dict is bounded
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host


@pytest.mark.parametrize("mutate, expected", [
    (lambda e: e.update(batches=[10**12]), "experiments.e1.batches[0]: expected at most 1,000,000, got 1000000000000"),
    (lambda e: e.update(batches=list(range(1, 66))), "experiments.e1.batches: expected at most 64 items, got 65"),
    (lambda e: e.update(streams=[65]), "experiments.e1.streams[0]: expected at most 64, got 65"),
    (lambda e: e.update(chunk_images=[2_000_000]), "experiments.e1.chunk_images[0]"),
    (lambda e: e.update(repeats=10**6), "experiments.e1.repeats"),
    (lambda e: e.update(warmup=10**6), "experiments.e1.warmup: expected at most 1,000, got 1000000"),
    (lambda e: e.update(stopping={"timeout_s": 10**6}), "experiments.e1.stopping.timeout_s: expected at most 3,600"),
    (lambda e: e.update(variants=["naive"] * 1001), "experiments.e1.variants: expected at most 1,000 items, got 1,001"),
    (lambda e: e.update(params={"naive": {"BLOCK": [64, 64]}}), "experiments.e1.params.naive.BLOCK"),
    (lambda e: e.update(params={"naive": {"BLOCK": ["x" * 65]}}), "experiments.e1.params.naive.BLOCK"),
    (lambda e: e.update(search={"strategy": "random", "max_settings": 10**6, "seed": 1}),
     "experiments.e1.search.max_settings: expected at most 10,000, got 1000000"),
])
def test_sizes_are_bounded_by_the_schema(tmp_path, mutate, expected):
    data = copy.deepcopy(BASE)
    mutate(data["experiments"]["e1"])
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: {re.escape(expected)}", str(info.value)), str(info.value)


def test_a_list_of_millions_of_batches_is_refused_quickly():
    import time

    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["batches"] = [100] * 6_500_000
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^x.yaml: experiments.e1.batches: more than 20,000 values"):
        validate(data, "x.yaml")
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host


def test_a_grid_of_too_many_settings_is_refused_before_it_is_enumerated(tmp_path, monkeypatch):
    from convsweep.model import variants

    monkeypatch.setattr(variants, "MAX_SETTINGS", 20)
    data = copy.deepcopy(BASE)
    blocks = [64, 128, 256, 512, 1024]
    data["experiments"]["e1"]["params"] = {"naive": {"conv1": {"BLOCK": blocks}, "conv2": {"BLOCK": blocks}}}
    with pytest.raises(ConfigError, match=r"experiments.e1.variants\[0\]: the grid holds 25 settings \(the product of "
                                          r"its value lists\); a job measures at most 20$"):
        expand_config(load_config(write(tmp_path, data)))


def test_a_sweep_of_too_many_jobs_is_refused_before_it_is_expanded(tmp_path, monkeypatch):
    from convsweep.sweep import config

    monkeypatch.setattr(config, "MAX_JOBS", 5)
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(batches=[1, 2, 3], streams=[1, 2])
    axes = re.escape("(" + " x ".join(["variants", *(axis.key for axis in AXES)]) + ")")
    with pytest.raises(ConfigError, match=rf"experiments.e1: the sweep's axes {axes} multiply to more than 5 jobs; split"):
        expand_config(load_config(write(tmp_path, data)))


@pytest.mark.parametrize("dataset, expected", [
    ("mnist", "experiments.e1.dataset: unknown dataset 'mnist'; expected one of mnist5k, random, "
              "or IDX files as {name, images, labels}; did you mean 'mnist5k'?"),
    ({"name": "fashion", "images": "nope-images.gz", "labels": "nope-labels.gz"},
     "experiments.e1.dataset: images: no such file 'nope-images.gz'"),
])
def test_an_unknown_dataset_is_refused_while_the_sweep_is_planned(tmp_path, dataset, expected):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["dataset"] = dataset
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        expand_config(load_config(path))
    assert str(info.value) == f"{path}:6: {expected}"  # yaml.safe_dump sorts: batches (3 lines), then dataset


def test_weights_that_do_not_fit_the_network_are_refused_while_the_sweep_is_planned(tmp_path):
    from convsweep.sweep.config import ROOT

    weights = ROOT / "data" / "lenet86-weights.npz"
    lenet = (ROOT / "networks" / "lenet86.yaml").read_text()
    (tmp_path / "net.yaml").write_text(lenet.replace("../data/lenet86-weights.npz", str(weights))
                                       .replace("out_channels: 4, kernel: 7", "out_channels: 4, kernel: 5"))
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["network"] = "net.yaml"
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        expand_config(load_config(path))
    assert str(info.value) == (f"{path}:6: experiments.e1.network: {weights}: conv1.weight: expected shape (4, 1, 5, 5), "
                               "got (4, 1, 7, 7)")


def test_a_batch_no_gpu_can_hold_is_refused_while_the_sweep_is_planned(tmp_path):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(network="networks/conv256.yaml", dataset="random", batches=[4, 10000])
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        expand_config(load_config(path))
    assert str(info.value) == (f"{path}:3: experiments.e1.batches: batch 10,000 at 1 stream(s) needs at least 1,303 GB "
                               "of GPU memory for conv256.yaml (input, layer outputs, weights); the largest GPU here "
                               "has 141 GB")
    # LeNet-86 at a million images: whole-batch buffers at one stream do not fit; four streams' chunks do.
    data["experiments"]["e1"].update(network="networks/lenet86.yaml", dataset="mnist5k", batches=[1_000_000])
    with pytest.raises(ConfigError, match="batch 1,000,000 at 1 stream"):
        expand_config(load_config(write(tmp_path, data)))
    data["experiments"]["e1"].update(streams=[4], variants=["naive", "reference"])
    assert len(expand_config(load_config(write(tmp_path, data)))) == 2


def test_device_bytes_counts_the_chunks_the_runner_cuts():
    """Each stream holds a lane of layer outputs for the largest chunk runner.pass_chunks cuts."""
    import math

    from convsweep.sweep.config import device_bytes
    from convsweep.model.network import load_network
    from convsweep.base.paths import ROOT
    from convsweep.measure.runner import pass_chunks

    net = load_network(ROOT / "networks" / "lenet86.yaml")
    steps = net.steps({"conv1": (), "conv2": ()})
    outputs = sum(math.prod(step.last.out_shape) for step in steps if step.layer.kind.owns_output)
    for batch, streams, chunk in [(10000, 1, None), (10000, 4, None), (10, 8, None), (1000, 2, 300), (100, 1, 500)]:
        biggest = max(hi - lo for lo, hi in pass_chunks(batch, streams, chunk))
        lanes = device_bytes(net, steps, batch, streams, chunk) - device_bytes(net, [], batch, streams, chunk)
        assert lanes == 4 * streams * biggest * outputs


def test_profiler_auto_is_the_default_and_reaches_the_specs(tmp_path):
    job = expand_config(load_config(write(tmp_path, BASE)))[0]
    assert job.profiler == "auto" and job.runs()[0].to_dict()["profiler"] == "auto"
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"]["profiler"] = "nsys"
    assert expand_config(load_config(write(tmp_path, data)))[0].profiler == "nsys"


# -- issue 54: a sweep file's errors name its line and the nearest known name ---------------------------

NEWCOMER = """\
# a sweep as a newcomer writes it
experiments:
  lenet86:
    network: networks/lenet86.yaml
    variants: [naive, reference]
    batches: [100]
    params:
      naive: {BLOCK: [128]}
"""


def newcomer_sweep(tmp_path, old: str, new: str):
    assert old in NEWCOMER
    path = tmp_path / "experiments.yaml"
    path.write_text(NEWCOMER.replace(old, new, 1))
    return path


def only_line(call) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and len(message) < 250, message
    return message


@pytest.mark.parametrize("old, new, expected", [
    ("batches:", "batchs:", "6: experiments.lenet86.batchs: unknown key; did you mean 'batches'?"),
    ("[100]", "[one]", "6: experiments.lenet86.batches[0]: expected integer, got \"one\""),
    ("    params:", "    stopping: {max_nosie: 0.01}\n    params:",
     "7: experiments.lenet86.stopping.max_nosie: unknown key; did you mean 'max_noise'?"),
    ("    params:", "    checks: fst\n    params:",
     "7: experiments.lenet86.checks: expected one of ['full', 'fast'], got \"fst\"; did you mean 'fast'?"),
    ("[naive, reference]", "[naiv, reference]",
     "5: experiments.lenet86.variants[0]: unknown variant 'naiv'; did you mean 'naive'?"),
    ("[naive, reference]", "\n      - naive\n      - {conv1: naive, conv2: tiled_shard}",
     "7: experiments.lenet86.variants[1].conv2: unknown variant 'tiled_shard'; did you mean 'tiled_shared'?"),
    ("[naive, reference]", "[{conv1: naive, conv3: naive}]",
     "5: experiments.lenet86.variants[0].conv3: unknown layer 'conv3' (conv layers: conv1, conv2)"),
    ("      naive:", "      naiv:",
     "8: experiments.lenet86.params.naiv: unknown variant 'naiv'; did you mean 'naive'?"),
    ("{BLOCK:", "{BLOK:",  # refused in convsweep.model.variants, on the `where` the expansion gave it
     "8: experiments.lenet86.params.naive.BLOK: variant 'naive' has no tunable 'BLOK' (tunables: BLOCK)"),
    ("    batches:", "    dataset: mnist5\n    batches:",
     "6: experiments.lenet86.dataset: unknown dataset 'mnist5'; expected one of mnist5k, random, or IDX files as "
     "{name, images, labels}; did you mean 'mnist5k'?"),
    ("networks/lenet86.yaml", "networks/lenet68.yaml",
     "4: experiments.lenet86.network: no such file 'networks/lenet68.yaml'; did you mean 'networks/lenet86.yaml'?"),
])
def test_a_newcomers_mistake_is_one_line_with_its_line_and_the_nearest_name(tmp_path, old, new, expected):
    path = newcomer_sweep(tmp_path, old, new)
    message = only_line(lambda: expand_config(load_config(path)))
    assert message.startswith(f"{path}:{expected}"), message


def test_an_experiment_named_with_dots_still_gets_its_lines(tmp_path):
    """The expansion's errors are `file: experiments.NAME.key: ...`; the key path after a name with dots reads back."""
    path = newcomer_sweep(tmp_path, "  lenet86:", "  lenet.v2:")
    another = "  lenet:\n    variants: [naive]\n    batches: [1]\n"  # a name the first begins with
    path.write_text(path.read_text().replace("{BLOCK:", "{BLOK:") + another)
    assert only_line(lambda: expand_config(load_config(path))) == \
        f"{path}:8: experiments.lenet.v2.params.naive.BLOK: variant 'naive' has no tunable 'BLOK' (tunables: BLOCK)"


def test_an_unknown_variant_names_a_few_or_where_to_look_never_the_whole_registry(tmp_path):
    from convsweep.model.variants import load_registry

    registry = load_registry()
    message = only_line(lambda: expand_config(load_config(newcomer_sweep(tmp_path, "[naive,", "[qqqqzzzz,"))))
    assert message.endswith(f":5: experiments.lenet86.variants[0]: unknown variant 'qqqqzzzz' "
                            f"({len(registry)} known: see kernels/variants.yaml)"), message
    message = only_line(lambda: expand_config(load_config(newcomer_sweep(tmp_path, "[naive,", "[wmma,"))))
    assert sum(name in message for name in registry) <= 3, message  # a few near names at most


def test_the_cli_and_the_workflow_say_the_same_line(tmp_path):
    import subprocess
    import sys

    from convsweep.app.plan import SweepPlan

    path = newcomer_sweep(tmp_path, "batches:", "batchs:")
    proc = subprocess.run([sys.executable, "-m", "convsweep", "jobs", "--config", str(path)], capture_output=True,
                          text=True)
    expected = f"{path}:6: experiments.lenet86.batchs: unknown key; did you mean 'batches'?"
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [f"convsweep: {expected}"], proc.stderr
    assert only_line(lambda: SweepPlan(yaml.safe_load(path.read_text()), path)) == expected
    path = newcomer_sweep(tmp_path, "[naive,", "[naiv,")
    assert only_line(lambda: SweepPlan(yaml.safe_load(path.read_text()), path)) == \
        f"{path}:5: experiments.lenet86.variants[0]: unknown variant 'naiv'; did you mean 'naive'?"


def test_a_value_an_override_changed_has_no_line(tmp_path):
    """Snakemake's --config merges into the dict SweepPlan gets: what the file does not say has no line there."""
    from convsweep.app.plan import SweepPlan

    path = newcomer_sweep(tmp_path, "[naive,", "[naiv,")
    config = yaml.safe_load(path.read_text())
    config["experiments"]["lenet86"]["variants"] = ["naiv2"]
    assert only_line(lambda: SweepPlan(config, path)) == \
        f"{path}: experiments.lenet86.variants[0]: unknown variant 'naiv2'; did you mean 'naive'?"
    config["experiments"]["lenet86"].update(variants=["naive"], checks="fsst")
    assert only_line(lambda: SweepPlan(config, path)).startswith(f"{path}: experiments.lenet86.checks: expected one of")
