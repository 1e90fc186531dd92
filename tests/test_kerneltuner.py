"""Kernel Tuner interop (convsweep.app.kerneltuner), checked against Kernel Tuner itself: stored runs exported as T4
results valid under the schema of the installed kernel_tuner package, their values read back; a cache file that
kernel_tuner's tune_kernel writes (its C backend, on the CPU) imported as runs marked as imported, with the device
it names, its failed configurations failed with the reason, agreeing with kernel_tuner's own T4 results of the same
tuning; a second import, and one of the file as Kernel Tuner leaves it open, store nothing twice; bad files and
what a cache cannot say are one line each; and migration 0015's column, up and down. On SQLite, and PostgreSQL
where CONVSWEEP_TEST_PG_URL is set."""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

import jsonschema
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

# A test dependency (pip install -e '.[test]'): a machine without it (the lent GPU's) skips this file, saying why.
kernel_tuner = pytest.importorskip("kernel_tuner", reason="kernel_tuner is not installed (pip install -e '.[test]')")

from convsweep.base.errors import ConfigError, ConvsweepError
from convsweep.app.commands import export, import_
from convsweep.app.kerneltuner import check_t4, export_t4, import_cache, t4_results_schema
from convsweep.model.network import load_network
from convsweep.base.paths import resolve_network_path
from convsweep.analysis.query import fetch_dicts
from convsweep.store import Base, ingest_result, migrate, open_store
from kernel_tuner.file_utils import get_t4_results, output_file_schema
from kernel_tuner.util import read_cache as kt_read_cache

from store_fixtures import make_job_file, make_result, tuning_results


VARIANT = "restrict_unroll"  # tunables BLOCK and UNROLL_C
LAYER, BATCH = "conv2", 100
# One C function Kernel Tuner compiles per configuration: its return value is the configuration's time in ms (the
# C backend's convention), so the times are known; BLOCK 1024 does not compile (the message Kernel Tuner skips
# past), BLOCK 2048 is more threads than a block may have (InvalidConfig).
KERNEL_SOURCE = r"""
#if BLOCK > 512
#error uses too much shared data
#endif
float restrict_unroll(float *out, const float *in, int n) {
    for (int i = 0; i < n; i++) out[i] = 2.0f * in[i];
    return 0.001f * BLOCK + 0.01f * UNROLL_C;
}
"""
TUNE_PARAMS = {"BLOCK": [128, 256, 512, 1024, 2048], "UNROLL_C": [1, 2]}
MEASURED = 6  # BLOCK 128, 256, 512 at both UNROLL_C
T4_INVALIDITY = {"ok": "correct", "suspect": "correct", "incorrect": "correctness"}


def layer_output(layer: str = LAYER, variant: str = VARIANT) -> tuple[int, ...]:
    """The per-image output (M, H_out, W_out) of the variant at a conv layer of LeNet-86."""
    from convsweep.model.variants import get_variant

    network = load_network(resolve_network_path("networks/lenet86.yaml"))
    return network.variant_shape(network.layer(layer), get_variant(variant).fuses).out_shape[1:]


@pytest.fixture(scope="module")
def kt_tuning(tmp_path_factory):
    """(cache file, tune_kernel's results) of Kernel Tuner tuning KERNEL_SOURCE on the CPU, its problem_size conv2's
    output at batch 100 as (W_out, H_out, M * batch): the cache is kernel_tuner's own, written as it tunes."""
    if shutil.which("g++") is None:
        pytest.skip("Kernel Tuner's C backend needs g++ to write a cache without a GPU")
    import numpy as np

    m, h, w = layer_output()
    work = tmp_path_factory.mktemp("kt")
    cache = work / "restrict_unroll.json"
    data = np.arange(64, dtype=np.float32)
    here = Path.cwd()
    os.chdir(work)  # Kernel Tuner writes its temporary sources to the current directory
    try:
        results, _ = kernel_tuner.tune_kernel(
            "restrict_unroll", KERNEL_SOURCE, (w, h, m * BATCH), [np.zeros_like(data), data, np.int32(data.size)],
            TUNE_PARAMS, lang="C", block_size_names=["BLOCK"], cache=str(cache), iterations=3, quiet=True)
    finally:
        os.chdir(here)
    return cache, results


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'db' / 'results.sqlite'}"


def stored_runs(url: str) -> list[dict]:
    _, runs = fetch_dicts(url, "SELECT r.*, e.gpu FROM run r JOIN environment e ON e.id = r.environment_id ORDER BY r.id")
    return runs


def op_times(url: str) -> dict[int, float | None]:
    _, rows = fetch_dicts(url, "SELECT run_id, layer, op_time_ms FROM layer_time")
    assert {row["layer"] for row in rows} == {LAYER}
    return {row["run_id"]: row["op_time_ms"] for row in rows}


def samples(url: str) -> dict[int, list[float]]:
    _, rows = fetch_dicts(url, "SELECT run_id, value FROM sample WHERE metric = 'op_time_ms' ORDER BY run_id, repeat")
    found: dict[int, list[float]] = {}
    for row in rows:
        found.setdefault(row["run_id"], []).append(row["value"])
    return found


def config_of(params: str | dict) -> tuple:
    params = json.loads(params) if isinstance(params, str) else params
    return params[LAYER]["BLOCK"], params[LAYER]["UNROLL_C"]


# -- import -----------------------------------------------------------------------------------------------------

def test_a_kernel_tuner_cache_is_stored_as_imported_runs(db_url, kt_tuning):
    cache, results = kt_tuning
    done = import_cache(db_url, cache)  # variant from kernel_name, layer and batch from problem_size
    assert (done.kernel.variant, done.kernel.layer, done.kernel.batch) == (VARIANT, LAYER, BATCH)
    assert (done.added, done.unchanged, done.by_status) == (10, 0, {"ok": MEASURED, "failed": 4})
    runs = stored_runs(db_url)
    assert {run["imported_from"] for run in runs} == {f"kernel_tuner:{cache}"}
    assert {(run["experiment"], run["variant"], run["batch"], run["streams"], run["host_memory"], run["profiler"])
            for run in runs} == {("kernel-tuner", VARIANT, BATCH, 1, "pageable", "kernel_tuner")}
    assert {run["gpu"] for run in runs} == {None}  # the C backend's device_name is ""
    by_config = {(r["BLOCK"], r["UNROLL_C"]): r for r in results}
    times, passes = op_times(db_url), samples(db_url)
    for run in runs:
        tuned = by_config[config_of(run["params"])]
        error = tuned.get("__error__")
        if error is None:
            assert run["status"] == "ok" and run["error"] is None
            assert times[run["id"]] == pytest.approx(tuned["time"])
            assert tuned["time"] == pytest.approx(0.001 * tuned["BLOCK"] + 0.01 * tuned["UNROLL_C"])
            assert passes[run["id"]] == pytest.approx(tuned["times"]) and run["repeats"] == 3
            assert run["compile_ms"] == pytest.approx(tuned["compile_time"])
        else:  # the failed ones say which of Kernel Tuner's errors they had, and have no time
            assert run["status"] == "failed" and run["error"].startswith(f"Kernel Tuner: {error}: ")
            assert times[run["id"]] is None and run["id"] not in passes
    failed = {config_of(run["params"]): run["error"].split(":")[1].strip() for run in runs if run["status"] == "failed"}
    assert failed == {(1024, 1): "CompilationFailedConfig", (1024, 2): "CompilationFailedConfig",
                      (2048, 1): "InvalidConfig", (2048, 2): "InvalidConfig"}


def test_the_device_a_cache_names_is_the_runs_environment(sqlite_url, kt_tuning, tmp_path):
    cache, _ = kt_tuning
    data = json.loads(cache.read_text())
    data["device_name"] = "NVIDIA H100 80GB HBM3"
    named = tmp_path / "h100.json"
    named.write_text(json.dumps(data))
    assert import_cache(sqlite_url, named, experiment="kt-h100").added == 10
    assert {run["gpu"] for run in stored_runs(sqlite_url)} == {"NVIDIA H100 80GB HBM3"}


def test_importing_a_cache_again_stores_nothing_twice_even_as_kernel_tuner_reopened_it(db_url, kt_tuning, tmp_path):
    cache, _ = kt_tuning
    assert import_cache(db_url, cache).added == 10
    again = import_cache(db_url, cache)
    assert (again.added, again.unchanged) == (0, 10)
    reopened = tmp_path / cache.name
    shutil.copy(cache, reopened)
    kt_read_cache(str(reopened), open_cache=True)  # how Kernel Tuner leaves a cache it goes on tuning into
    assert reopened.read_text().rstrip().endswith(",")
    third = import_cache(db_url, reopened)
    assert (third.added, third.unchanged) == (0, 10)
    assert len(stored_runs(db_url)) == 10


def test_a_cache_with_a_new_configuration_stores_that_one_alone(sqlite_url, kt_tuning, tmp_path):
    """Kernel Tuner appends to a cache as it goes on tuning: a measurement id is of the header and its entry, not
    of the whole file, so the entries imported before stay stored once."""
    cache, _ = kt_tuning
    import_cache(sqlite_url, cache)
    data = json.loads(cache.read_text())
    entry = {**data["cache"]["128,1"], "UNROLL_C": 4, "time": 0.168, "times": [0.168, 0.168, 0.168]}
    data["cache"]["128,4"] = entry
    grown = tmp_path / "grown.json"
    grown.write_text(json.dumps(data))
    done = import_cache(sqlite_url, grown)
    assert (done.added, done.unchanged) == (1, 10)


def test_what_a_cache_cannot_say_is_given(sqlite_url, kt_tuning, tmp_path):
    cache, _ = kt_tuning
    data = json.loads(cache.read_text())
    data["kernel_name"], data["problem_size"] = "conv_forward", "callable"  # many variants launch conv_forward
    vague = tmp_path / "vague.json"
    vague.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"kernel_name 'conv_forward' is launched by \d+ variants .*: give --variant"):
        import_cache(sqlite_url, vague)
    with pytest.raises(ConfigError, match=r"problem_size \"callable\" .*: give --layer and --batch$"):
        import_cache(sqlite_url, vague, variant=VARIANT)
    with pytest.raises(ConfigError, match=r"give --batch$"):
        import_cache(sqlite_url, vague, variant=VARIANT, layer=LAYER)
    done = import_cache(sqlite_url, vague, variant=VARIANT, layer="conv1", batch=7)
    assert (done.kernel.layer, done.kernel.batch, done.added) == ("conv1", 7, 10)
    assert {run["batch"] for run in stored_runs(sqlite_url)} == {7}


def test_problem_size_names_the_layer_and_the_batch_only_when_one_fits(sqlite_url, kt_tuning, tmp_path):
    cache, _ = kt_tuning
    conv1, conv2 = math.prod(layer_output("conv1")), math.prod(layer_output("conv2"))
    both = conv1 * conv2 // math.gcd(conv1, conv2)  # a whole batch of either layer's outputs
    data = json.loads(cache.read_text())
    data["problem_size"] = both
    vague = tmp_path / "both.json"
    vague.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"it fits 2; .*: give --layer and --batch$"):
        import_cache(sqlite_url, vague)
    done = import_cache(sqlite_url, vague, layer="conv1")
    assert (done.kernel.layer, done.kernel.batch) == ("conv1", both // conv1)


def write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def cache_like(**changes) -> dict:
    """A cache in Kernel Tuner's shape (util.process_cache's header, store_cache's entries), with `changes`."""
    entry = {"BLOCK": 128, "UNROLL_C": 1, "time": 0.1, "times": [0.1, 0.1], "compile_time": 40.0,
             "verification_time": 0, "benchmark_time": 0.2, "timestamp": "2026-11-26 09:13:28.633861+00:00"}
    data = {"device_name": "", "kernel_name": VARIANT, "problem_size": [34, 34, 1600],
            "tune_params_keys": ["BLOCK", "UNROLL_C"], "tune_params": TUNE_PARAMS, "objective": ["time"],
            "cache": {"128,1": entry}}
    for key, value in changes.items():
        if key == "entry":
            entry.update(value)
        else:
            data[key] = value
    return data


@pytest.mark.parametrize("content, expected", [
    ("{ not json", r"not a Kernel Tuner cache file: not JSON"),
    ([1, 2], r"not a Kernel Tuner cache file: expected an object with device_name, kernel_name, tune_params_keys, "
             r"cache; it lacks device_name, kernel_name"),
    ({"device_name": "x"}, r"it lacks kernel_name, tune_params_keys, cache$"),
    (cache_like(cache={}), r"cache: no configuration in it"),
    (cache_like(kernel_name=["conv"]), r"kernel_name: expected a string, got \['conv'\]"),
    (cache_like(tune_params_keys=["BLOCK", "TILE"]), r"'TILE' is no tunable of variant restrict_unroll"),
    (cache_like(kernel_name="no_such_kernel"), r"names no variant .*: give --variant"),
    (cache_like(entry={"time": -1.0}), r"cache\['128,1'\]\.time: expected a finite number of milliseconds"),
    (cache_like(entry={"time": "Skipped"}), r"cache\['128,1'\]\.time: expected a finite number"),
    (cache_like(entry={"times": [0.1, None]}), r"cache\['128,1'\]\.times\[1\]: expected a finite number"),
    (cache_like(entry={"timestamp": "yesterday"}), r"cache\['128,1'\]\.timestamp: expected a time"),
], ids=["not-json", "not-an-object", "no-header", "empty", "kernel-name-list", "unknown-tunable", "unknown-kernel", "negative-time",
        "string-time", "null-sample", "bad-timestamp"])
def test_a_bad_cache_file_is_one_line_naming_it(sqlite_url, tmp_path, content, expected):
    path = write(tmp_path, "bad.json", content)
    with pytest.raises(ConfigError, match=expected) as caught:
        import_cache(sqlite_url, path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # refused before the store is opened


def test_a_missing_file_and_a_layer_that_is_no_conv_are_one_line(sqlite_url, tmp_path):
    with pytest.raises(ConfigError, match=r"missing\.json: cannot read it: No such file"):
        import_cache(sqlite_url, tmp_path / "missing.json")
    path = write(tmp_path, "ok.json", cache_like())
    with pytest.raises(ConfigError, match=r"--layer relu1: expected a conv layer of networks/lenet86.yaml \(conv1, conv2\)"):
        import_cache(sqlite_url, path, layer="relu1")


# -- export -----------------------------------------------------------------------------------------------------

def t4_schema() -> dict:
    return output_file_schema("results")[1]


def compile_failure() -> dict:
    return make_result("tiled", 1000, status="failed",
                       error="kernels/tiled_shared.cu:12: identifier TILE undefined (variant 'tiled', NVRTC)")


def test_results_that_break_the_t4_schema_are_refused_naming_the_key():
    version, schema = t4_results_schema()
    assert (version, schema) == output_file_schema("results")
    broken = {"schema_version": version, "results": [{"configuration": {}, "times": {"runtimes": "fast"},
                                                      "invalidity": "correct", "correctness": 1}]}
    with pytest.raises(ConvsweepError, match=rf"schema {version} at results\[0\]\.times\.runtimes: 'fast' is not of type 'array'"):
        check_t4(broken, schema, version)


def test_without_kernel_tuner_an_export_says_what_to_install(sqlite_url, tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(ConfigError, match=r"Kernel Tuner's T4 results schema, which comes with its package: "
                                          r"pip install kernel_tuner$"):
        export_t4(sqlite_url, "lenet86-baseline", tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()

def test_an_experiments_runs_export_as_valid_t4_results_and_read_back(db_url, tmp_path):
    job = make_job_file(tuning_results())  # naive BLOCK 64 ok, 128 incorrect, 256 failed (not NVRTC's)
    tiled, failure = make_result("tiled", 100, op_time_ms=(0.06, 0.15)), compile_failure()
    engine = open_store(db_url)
    for result in (job, tiled, failure):
        ingest_result(engine, result)
    engine.dispose()
    out = tmp_path / "t4" / "results.json"
    done = export_t4(db_url, "lenet86-baseline", out)
    document = json.loads(out.read_text())
    jsonschema.validate(document, t4_schema())  # the schema of the installed kernel_tuner, independently
    assert document["schema_version"] == output_file_schema("results")[0] == done.schema_version
    assert document["metadata"] == {"timeunit": "milliseconds", "experiment": "lenet86-baseline", "time": "op_time"}
    assert done.results == 5 and dict(done.invalidity) == {"correct": 2, "correctness": 1, "runtime": 1, "compile": 1}
    stored = {(m["spec"]["variants"]["conv1"], m["spec"]["batch"], json.dumps(m["spec"]["params"], sort_keys=True)): m
              for m in [*job["measurements"], tiled, failure]}
    failed = {}
    for result in document["results"]:
        config = result["configuration"]
        assert set(config) == {"network", "conv1.variant", "conv2.variant", "batch", "streams", "host_memory",
                               "input_format", "cache", "timer", *(k for k in config if k.endswith(".BLOCK"))}
        params = {layer: {k.split(".")[1]: v for k, v in config.items()
                          if k.startswith(f"{layer}.") and not k.endswith(".variant")} for layer in ("conv1", "conv2")}
        source = stored.pop((config["conv1.variant"], config["batch"], json.dumps(params, sort_keys=True)))
        measured = {m["name"]: m["value"] for m in result["measurements"]}
        assert measured["status"] == source["status"] and result["objectives"] == ["time"]
        assert config["network"] == source["spec"]["network"] and config["streams"] == source["spec"]["streams"]
        assert datetime.fromisoformat(result["timestamp"]) == datetime.fromisoformat(source["started_at"])
        if source["status"] == "failed":
            assert "time" not in measured and result["times"]["runtimes"] == [] and result["correctness"] == 0
            failed[config["conv1.variant"]] = result["invalidity"]
            continue
        assert result["invalidity"] == T4_INVALIDITY[source["status"]]
        op_time_ms = source["timings"]["op_time_ms"]
        assert measured["time"] == pytest.approx(sum(op_time_ms.values()))  # Op Time: the conv layers added up
        assert measured["conv2.op_time_ms"] == pytest.approx(op_time_ms["conv2"])
        assert measured["forward_ms"] == pytest.approx(source["timings"]["forward_ms"])
        per_pass = [sum(s["value"] for s in source["samples"] if s["metric"] == "op_time_ms" and s["repeat"] == r)
                    for r in range(3)]
        assert result["times"]["runtimes"] == pytest.approx(per_pass)
        assert result["times"]["compilation_time"] == pytest.approx(source["timings"]["compile_ms"])
        assert result["times"]["benchmark"] == pytest.approx(1000 * source["phases_s"]["timed"])
    assert not stored  # every run written once
    assert failed == {"naive": "runtime", "tiled": "compile"}


def test_the_metric_is_what_time_holds(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    ingest_result(engine, make_result("naive", 100, op_time_ms=(0.25, 0.5)))
    engine.dispose()
    for metric, expected in (("conv1", 0.25), ("forward_ms", 4.75), ("op_time", 0.75)):
        export_t4(sqlite_url, "lenet86-baseline", tmp_path / f"{metric}.json", metric=metric)
        (result,) = json.loads((tmp_path / f"{metric}.json").read_text())["results"]
        assert result["measurements"][0] == {"name": "time", "value": pytest.approx(expected), "unit": "ms"}
    with pytest.raises(ConfigError, match=r"--metric 'conv9': expected op_time, forward_ms or a conv layer .*\(conv1, conv2\)"):
        export_t4(sqlite_url, "lenet86-baseline", tmp_path / "x.json", metric="conv9")
    with pytest.raises(ConvsweepError, match=r"experiment 'nothing' has no stored run"):
        export_t4(sqlite_url, "nothing", tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_kernel_tuners_t4_results_and_ours_of_the_same_tuning_agree(db_url, kt_tuning, tmp_path):
    """Import Kernel Tuner's cache, export it again: every configuration has the validity, time, runtimes and
    compile time that Kernel Tuner's own T4 results (file_utils.get_t4_results) give it."""
    cache, results = kt_tuning
    import_cache(db_url, cache)
    export_t4(db_url, "kernel-tuner", tmp_path / "ours.json")
    ours = json.loads((tmp_path / "ours.json").read_text())
    theirs = get_t4_results(results, TUNE_PARAMS)
    jsonschema.validate(ours, t4_schema())
    assert ours["schema_version"] == theirs["schema_version"]
    assert ours["metadata"]["timeunit"] == theirs["metadata"]["timeunit"]
    mine = {(r["configuration"][f"{LAYER}.BLOCK"], r["configuration"][f"{LAYER}.UNROLL_C"]): r for r in ours["results"]}
    assert len(mine) == len(theirs["results"]) == 10
    for result in theirs["results"]:
        own = mine[(result["configuration"]["BLOCK"], result["configuration"]["UNROLL_C"])]
        assert own["invalidity"] == result["invalidity"] and own["objectives"] == result["objectives"]
        assert own["times"]["runtimes"] == pytest.approx(result["times"]["runtimes"])
        assert own["times"]["compilation_time"] == pytest.approx(result["times"]["compilation"])
        assert datetime.fromisoformat(own["timestamp"]) == datetime.fromisoformat(result["timestamp"])
        their_time = [m["value"] for m in result["measurements"] if m["name"] == "time"]
        own_time = [m["value"] for m in own["measurements"] if m["name"] == "time"]
        assert own_time == pytest.approx(their_time)  # none for a configuration Kernel Tuner could not measure


# -- the command line -------------------------------------------------------------------------------------------

def run_cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="convsweep")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (export, import_):
        command.add_parser(sub)
    args = parser.parse_args(argv)
    args.func(args)


def test_export_and_import_on_the_command_line(sqlite_url, tmp_path, capsys):
    data = cache_like()  # an older cache: Kernel Tuner's error name in `time`
    data["cache"]["1024,1"] = {"BLOCK": 1024, "UNROLL_C": 1, "time": "CompilationFailedConfig", "compile_time": 9.0}
    path = write(tmp_path, "cache.json", data)
    run_cli(["import", str(path), "--db", sqlite_url, "--layer", "conv2", "--batch", "100"])
    assert capsys.readouterr().out == (f"{path}: restrict_unroll at conv2 of networks/lenet86.yaml, batch 100, "
                                       "experiment kernel-tuner: 2 runs stored (1 failed, 1 ok), 0 already stored\n")
    out = tmp_path / "out.json"
    run_cli(["export", "--experiment", "kernel-tuner", "--out", str(out), "--db", sqlite_url])
    assert capsys.readouterr().out == (f"wrote 2 results of kernel-tuner (1 compile, 1 correct) to {out} as Kernel "
                                       f"Tuner T4 {output_file_schema('results')[0]}, time = op_time\n")
    with pytest.raises(SystemExit):
        run_cli(["import", str(path), "--batch", "0"])
    assert "expected a positive integer" in capsys.readouterr().err


# -- migration 0015 ---------------------------------------------------------------------------------------------

def run_columns(connection) -> list[str]:
    return [c["name"] for c in inspect(connection).get_columns("run")]


def test_migration_0015_adds_imported_from_and_takes_it_away(db_url, tmp_path):
    """Runs stored before the column keep their rows and read NULL; latest_run shows it (PostgreSQL expands r.*
    when the view is made); a downgrade drops it and keeps every run, and upgrading again matches the models."""
    path = write(tmp_path, "cache.json", cache_like())
    engine = open_store(db_url)
    try:
        ingest_result(engine, make_result())
        migrate(engine, "0014", downgrade=True)
        with engine.connect() as connection:
            assert "imported_from" not in run_columns(connection)
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM latest_run").scalar() == 1
        migrate(engine, "head")
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            shown = list(connection.exec_driver_sql("SELECT * FROM latest_run WHERE 1 = 0").keys())
            assert shown[:len(run_columns(connection))] == run_columns(connection) and "imported_from" in shown
            assert connection.exec_driver_sql("SELECT imported_from FROM run").all() == [(None,)]
        import_cache(db_url, path, layer="conv2", batch=100)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM latest_run WHERE imported_from IS NOT NULL"
                                              ).scalar() == 1
        migrate(engine, "0014", downgrade=True)
        with engine.connect() as connection:
            assert "imported_from" not in run_columns(connection)
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM run").scalar() == 2
    finally:
        engine.dispose()



# -- an import within bounds (issue 52) -------------------------------------------------------------------------

def nested(levels: int) -> str:
    """A cache whose one extra key holds arrays `levels` deep: Python's json gave a RecursionError past ~1,000."""
    return json.dumps(cache_like())[:-1] + ', "extra": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize("content, expected", [
    (nested(100_000), r"not a Kernel Tuner cache file: nested more than 64 levels deep$"),
    (cache_like(device_name="H100\ud800"), r": device_name: expected text, got a lone UTF-16 surrogate in "
                                           r"\"H100\\ud800\""),
    (cache_like(cache={"128,1\udc00": cache_like()["cache"]["128,1"]}), r": cache: expected text, got a lone UTF-16 "
                                                                        r"surrogate in \"128,1\\udc00\""),
    (cache_like(entry={"BLOCK": float("nan")}), r": cache\.128,1\.BLOCK: expected a finite number, got NaN$"),
    (json.dumps(cache_like()).replace('"UNROLL_C": 1,', '"UNROLL_C": 1e999,'),
     r": cache\.128,1\.UNROLL_C: expected a finite number, got Infinity$"),
    ('{"device_name": "caf\u00e9"}'.encode("latin-1"), r"not a Kernel Tuner cache file: not UTF-8 text \(invalid "
                                                       r"continuation byte at byte 20\)$"),
    (cache_like(entry={"BLOCK": [128]}), r"cache\['128,1'\]\.BLOCK: expected a number or a string \(a tunable's "
                                         r"value\), got \[128\]$"),
    (cache_like(entry={"UNROLL_C": None}), r"cache\['128,1'\]\.UNROLL_C: expected a number or a string"),
], ids=["deep", "surrogate-value", "surrogate-key", "nan-tunable", "overflowing-float", "latin1", "list-tunable",
        "null-tunable"])
def test_a_cache_past_the_bounds_is_one_line_before_the_store_is_opened(sqlite_url, tmp_path, content, expected):
    """Before: the deep file was a RecursionError's traceback, the surrogates a UnicodeEncodeError's from the
    database driver after the store was opened, and a NaN or a list as a tunable's value was stored."""
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else
                     (content if isinstance(content, str) else json.dumps(content)).encode())
    with pytest.raises(ConfigError, match=expected) as caught:
        import_cache(sqlite_url, path, layer=LAYER, batch=BATCH)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_a_cache_whose_name_is_not_utf8_is_one_line(sqlite_url, tmp_path):
    """Before: the name, stored as the runs' imported_from, was a UnicodeEncodeError's traceback from the driver."""
    path = write(tmp_path, "caf\udce9.json", cache_like())  # b"caf\xe9.json", as Python decodes it from argv
    with pytest.raises(ConfigError, match=r"\.json: expected a file name in UTF-8: it is stored with the runs"):
        import_cache(sqlite_url, path, layer=LAYER, batch=BATCH)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_a_cache_past_the_size_cap_is_refused_unread(sqlite_url, tmp_path, monkeypatch):
    import convsweep.app.kerneltuner as kerneltuner

    data = cache_like()
    for block in range(2, 40):
        data["cache"][f"{block},1"] = {**data["cache"]["128,1"], "BLOCK": block}
    path = write(tmp_path, "big.json", data)
    monkeypatch.setattr(kerneltuner, "MAX_CACHE_BYTES", 4_000)
    with pytest.raises(ConfigError, match=rf"^{path}: {path.stat().st_size:,} bytes; a Kernel Tuner cache file "
                                          r"holds at most 4,000$"):
        import_cache(sqlite_url, path, layer=LAYER, batch=BATCH)
    monkeypatch.undo()
    assert kerneltuner.MAX_CACHE_BYTES >= 59_000_000
    assert import_cache(sqlite_url, path, layer=LAYER, batch=BATCH).added == 39


def test_each_bad_cache_is_one_line_and_the_others_are_imported(sqlite_url, tmp_path, capsys):
    """As `convsweep ingest`: every file named is tried, each bad one is its own line, the exit status 1 at the end."""
    deep = write(tmp_path, "deep.json", nested(5_000))
    good = write(tmp_path, "good.json", cache_like())
    surrogate = write(tmp_path, "surrogate.json", cache_like(kernel_name="restrict_unroll\ud800"))
    with pytest.raises(SystemExit) as exited:
        run_cli(["import", str(deep), str(good), str(surrogate), "--db", sqlite_url, "--layer", LAYER,
                 "--batch", str(BATCH)])
    assert exited.value.code == 1
    out, err = capsys.readouterr()
    assert out == (f"{good}: restrict_unroll at conv2 of networks/lenet86.yaml, batch 100, experiment kernel-tuner: "
                   "1 runs stored (1 ok), 0 already stored\n")
    lines = err.splitlines()
    assert len(lines) == 2 and "Traceback" not in err
    assert lines[0].startswith(f"convsweep: {deep}: not a Kernel Tuner cache file: nested more than 64 levels")
    assert lines[1].startswith(f"convsweep: {surrogate}: kernel_name: expected text, got a lone UTF-16 surrogate")
    assert len(stored_runs(sqlite_url)) == 1


def synthetic_cache(n: int, value=int) -> dict:
    """A cache of `n` configurations, each with a BLOCK of its own (the case a list's `in` made quadratic)."""
    entry = cache_like()["cache"]["128,1"]
    return cache_like(cache={f"{i},1": {**entry, "BLOCK": value(i), "time": 0.1 + i * 1e-6} for i in range(n)})


class CountedInt(int):
    """A tunable value that counts the equality tests made of it: a list's `in` makes one per value it holds."""

    comparisons = 0

    def __eq__(self, other):
        CountedInt.comparisons += 1
        return int.__eq__(self, other)

    __hash__ = int.__hash__


def test_the_grid_of_a_cache_takes_no_comparison_per_pair_of_values():
    """Before: each configuration's value was looked for in the list of those before it, 2,000 values making
    ~2,000,000 comparisons (the 59 MB cache's ~280,000, ~4 * 10^10)."""
    from convsweep.app.kerneltuner import Kernel, cache_result

    n = 2_000
    data = synthetic_cache(n, CountedInt)
    CountedInt.comparisons = 0
    result = cache_result(Path("synthetic.json"), data, Kernel("networks/lenet86.yaml", VARIANT, LAYER, BATCH),
                          "kernel-tuner")
    assert CountedInt.comparisons <= n
    assert result.job["grid"][VARIANT] == {"BLOCK": list(range(n)), "UNROLL_C": [1]}
    assert [m.spec["params"][LAYER]["BLOCK"] for m in result.measurements] == list(range(n))


def test_the_grid_of_a_cache_is_built_in_near_linear_time():
    """Four times the configurations take less than eight times as long (best of three), and 100,000 of them (a
    ~21 MB cache) well under a second on any machine: before, 32,000 took ~5 s and 100,000 minutes."""
    from convsweep.app.kerneltuner import tunable_grid

    def seconds(n: int) -> float:
        entries = synthetic_cache(n)["cache"]
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            grid, settings = tunable_grid(Path("synthetic.json"), ["BLOCK", "UNROLL_C"], entries)
            best = min(best, time.perf_counter() - start)
        assert len(grid["BLOCK"]) == len(settings) == n
        return best

    small, large = seconds(25_000), seconds(100_000)
    assert large < 8 * small and large < 2.0, (small, large)


def test_a_large_cache_imports_whole_in_seconds(sqlite_url, tmp_path):
    """2,000 configurations (400 KB) through the whole import, each its own run with its own BLOCK, within a CPU
    time far above the ~2 ms a configuration takes (most of it the ingest's schema check and rows)."""
    n = 2_000
    path = write(tmp_path, "large.json", synthetic_cache(n))
    start = time.process_time()
    done = import_cache(sqlite_url, path, layer=LAYER, batch=BATCH)
    cpu_s = time.process_time() - start
    assert (done.added, done.by_status) == (n, {"ok": n}) and cpu_s < 30, cpu_s
    blocks = sorted(json.loads(run["params"])[LAYER]["BLOCK"] for run in stored_runs(sqlite_url))
    assert blocks == list(range(n))
