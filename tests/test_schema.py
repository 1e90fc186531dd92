import time

import pytest

from convsweep.base.errors import ConfigError
from convsweep.base.schema import MAX_VALUE_CHARS, _shown, check_size, did_you_mean, validate

SCHEMA = {
    "type": "object",
    "properties": {
        "batches": {"type": "array", "maxItems": 64, "items": {"type": "integer", "maximum": 1000}},
        "name": {"type": "string", "maxLength": 8},
        "path": {"description": "a path without shell characters", "type": "string", "pattern": "^[a-z/]+$"},
        "grid": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}},
    },
}


def bomb(levels: int = 9):
    """Python's view of a YAML alias bomb: each level is nine references to the one before."""
    value = ["lol"] * 9
    for _ in range(levels - 1):
        value = [value] * 9
    return value


def one_line(call) -> str:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        call()
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    return message


def test_errors_say_what_was_expected_without_printing_the_value():
    many = list(range(5000))
    assert one_line(lambda: validate({"batches": many}, SCHEMA, "s.yaml")) == \
        "s.yaml: batches: expected at most 64 items, got 5,000"
    assert one_line(lambda: validate({"name": "x" * 5000}, SCHEMA, "s.yaml")) == \
        "s.yaml: name: expected at most 8 characters, got 5,000"
    assert one_line(lambda: validate({"batches": [10**12]}, SCHEMA, "s.yaml")) == \
        "s.yaml: batches[0]: expected at most 1,000, got 1000000000000"
    assert one_line(lambda: validate({"path": "r;touch pwned;"}, SCHEMA, "s.yaml")) == \
        's.yaml: path: expected a path without shell characters, got "r;touch pwned;"'


def test_a_value_shown_in_an_error_is_cut_short_without_expanding_it():
    start = time.perf_counter()
    shown = _shown(bomb())  # 9**9 strings if it were expanded
    assert time.perf_counter() - start < 10  # unbounded it took minutes; loose for a loaded host
    assert len(shown) == MAX_VALUE_CHARS and shown.endswith("...")
    assert _shown("y" * 10**6) == '"' + "y" * (MAX_VALUE_CHARS - 4) + "..."


def test_an_alias_bomb_is_refused_before_the_schema_walks_it():
    message = one_line(lambda: validate({"grid": {"naive": bomb()}}, SCHEMA, "s.yaml", max_nodes=100_000))
    assert message.startswith("s.yaml: grid.naive") and "more than 100,000 values" in message


def test_a_list_of_millions_is_refused_at_the_bound():
    message = one_line(lambda: validate({"batches": [1] * 6_500_000}, SCHEMA, "s.yaml", max_nodes=100_000))
    assert message == "s.yaml: batches: more than 100,000 values (a list this long, or YAML aliases repeating one)"


def test_check_size_refuses_long_strings_deep_nesting_and_cycles():
    with pytest.raises(ConfigError, match=r"^s: name: a string of 50,000,000 characters; at most 10,000$"):
        check_size({"name": "x" * 50_000_000}, "s")
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        check_size(deep, "s")
    cycle: list = [1]
    cycle.append(cycle)
    with pytest.raises(ConfigError, match=r"^s: \[1\]: contains itself"):
        check_size(cycle, "s")
    shared = ["x"] * 10
    check_size({"a": shared, "b": shared}, "s", max_nodes=25)  # 1 + 2 keys + 2 x 11
    with pytest.raises(ConfigError, match="more than 24 values"):
        check_size({"a": shared, "b": shared}, "s", max_nodes=24)


@pytest.mark.parametrize("value, spelled", [(float("nan"), ".nan"), (float("inf"), ".inf"), (-float("inf"), "-.inf")])
def test_nan_and_infinities_are_refused_wherever_they_are(value, spelled):
    """Every comparison with NaN is false, so a schema's bounds pass it: refused before the schema, by key."""
    expected = f"expected a finite number, got {spelled}"
    bounded = {"type": "object", "properties": {"w": {"type": "number", "minimum": 0, "maximum": 60}}}
    assert one_line(lambda: validate({"w": value}, bounded, "s.yaml")) == f"s.yaml: w: {expected}"
    nested = {"grid": {"naive": [1, 2]}, "x": [{"y": 0.5}, {"z": [1.0, value]}], "later": value}
    assert one_line(lambda: validate(nested, {}, "s.yaml")) == f"s.yaml: x[1].z[1]: {expected}"  # the first
    assert one_line(lambda: validate({"k": {value: 1}}, {}, "s.yaml")) == f"s.yaml: k: a key: {expected}"
    assert one_line(lambda: validate(value, {}, "s.yaml")) == f"s.yaml: (top level): {expected}"


def test_a_sweep_file_with_nan_is_refused_while_it_is_read(tmp_path):
    """YAML's .nan passed experiments.schema.yaml's bounds and stopped the sweep later with a traceback (issue 52)."""
    from convsweep.sweep.config import load_config

    path = tmp_path / "experiments.yaml"
    experiment = ("experiments:\n  e:\n    variants: [reference]\n    batches: [8]\n    repeats: auto\n"
                  "    stopping: {max_noise: 0.01, min_time_s: %s}\n    energy_window_s: %s\n")
    path.write_text(experiment % (0.5, ".nan"))
    assert one_line(lambda: load_config(path)) == \
        f"{path}:7: experiments.e.energy_window_s: expected a finite number, got .nan"
    path.write_text(experiment % (".NaN", ".Inf"))  # the first in the file is named
    assert one_line(lambda: load_config(path)) == \
        f"{path}:6: experiments.e.stopping.min_time_s: expected a finite number, got .nan"
    path.write_text(experiment % (0.5, 0.25))
    assert load_config(path).experiments["e"]["energy_window_s"] == 0.25


def test_the_finite_check_walks_a_container_repeated_by_aliases_once():
    numbers = [0.5] * 9
    for _ in range(8):
        numbers = [numbers] * 9  # 9**9 numbers, were each repetition walked
    start = time.perf_counter()
    validate({"a": numbers, "b": numbers}, {}, "s.yaml")
    assert time.perf_counter() - start < 1


# -- lines and suggestions for the YAML files a person edits (issue 54) ------------------------------

NESTED = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "results_dir": {"type": "string"},
        "experiments": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False,
            "properties": {"batches": {"type": "array", "items": {"type": "integer"}},
                           "checks": {"enum": ["full", "fast"]},
                           "stopping": {"type": "object", "additionalProperties": False,
                                        "properties": {"max_noise": {"type": "number"},
                                                       "max_samples": {"type": "integer"}}}}}},
    },
}


def sweep_file(tmp_path, experiment: str, top: str = "") -> tuple:
    import yaml

    path = tmp_path / "experiments.yaml"
    path.write_text(f"{top}experiments:\n  lenet86:\n    batches: [100]\n{experiment}")
    return path, yaml.safe_load(path.read_text())


@pytest.mark.parametrize("experiment, top, expected", [
    ("    batchs: [100]\n", "", "4: experiments.lenet86.batchs: unknown key; did you mean 'batches'?"),
    ("    stopping:\n      max_nosie: 0.01\n", "", "5: experiments.lenet86.stopping.max_nosie: unknown key; "
                                                     "did you mean 'max_noise'?"),
    ("    zzqqxx: 1\n", "", "4: experiments.lenet86.zzqqxx: unknown key"),  # nothing close: no suggestion
    ("", "result_dir: out\n", "1: result_dir: unknown key; did you mean 'results_dir'?"),
    ("    checks: fst\n", "", "4: experiments.lenet86.checks: expected one of ['full', 'fast'], got \"fst\"; "
                            "did you mean 'fast'?"),
    ("    checks: thorough\n", "", "4: experiments.lenet86.checks: expected one of ['full', 'fast'], "
                                 "got \"thorough\""),
])
def test_an_error_in_a_yaml_file_names_its_line_and_the_nearest_name(tmp_path, experiment, top, expected):
    path, data = sweep_file(tmp_path, experiment, top)
    assert one_line(lambda: validate(data, NESTED, str(path), yaml_file=path)) == f"{path}:{expected}"


def test_without_its_yaml_file_an_error_keeps_its_words(tmp_path):
    """JSON results and bench files are validated without yaml_file: their messages are as before."""
    path, data = sweep_file(tmp_path, "    batchs: [100]\n    checks: fst\n")
    assert one_line(lambda: validate(data, NESTED, "s.json")) == \
        "s.json: experiments.lenet86: unknown key ('batchs' was unexpected)"
    del data["experiments"]["lenet86"]["batchs"]
    assert one_line(lambda: validate(data, NESTED, "s.json")) == \
        "s.json: experiments.lenet86.checks: expected one of ['full', 'fast'], got \"fst\""


def test_a_value_the_file_does_not_hold_gets_no_line(tmp_path):
    """The dict Snakemake passes holds --config overrides: a value the file does not say has no line."""
    path, data = sweep_file(tmp_path, "    checks: fst\n")
    data["experiments"]["lenet86"]["checks"] = "fsst"
    assert one_line(lambda: validate(data, NESTED, str(path), yaml_file=path)) == \
        f"{path}: experiments.lenet86.checks: expected one of ['full', 'fast'], got \"fsst\"; did you mean 'fast'?"
    path, data = sweep_file(tmp_path, "    stopping: {max_noise: .nan}\n")
    assert one_line(lambda: validate(data, NESTED, str(path), yaml_file=path)) == \
        f"{path}:4: experiments.lenet86.stopping.max_noise: expected a finite number, got .nan"


@pytest.mark.parametrize("word, choices, expected", [
    ("batchs", ["batches", "streams", "cache"], "; did you mean 'batches'?"),
    ("conv3", ["conv1", "conv2", "fc1"], "; did you mean 'conv1' or 'conv2'?"),  # as near as each other
    ("max_nosie", ["max_noise", "max_samples", "min_samples"], "; did you mean 'max_noise'?"),  # not one 0.3 worse
    ("fst", ["full", "fast"], "; did you mean 'fast'?"),
    ("wmma", [f"wmma_{i}" for i in range(10)], "; did you mean 'wmma_0', 'wmma_1' or 'wmma_2'?"),  # a few at most
    ("zzqqxx", ["batches", "streams"], ""),
    ("naive", ["naive"], ""),  # the word itself is no suggestion
    (3, ["3", "4"], ""),
    ("x" * 101, ["x" * 100], ""),
    ("fp23", ["fp32", True, None, {"a": 1}], "; did you mean 'fp32'?"),  # an enum may hold other things
])
def test_did_you_mean_names_a_few_close_names_or_nothing(word, choices, expected):
    assert did_you_mean(word, choices) == expected


def test_did_you_mean_writes_a_name_as_asked():
    assert did_you_mean("lenet68.yaml", ["lenet86.yaml", "conv256.yaml"], shown=lambda n: f"networks/{n}") == \
        "; did you mean 'networks/lenet86.yaml'?"
