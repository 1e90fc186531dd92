"""Strict, resilient ingest: numbers no column can hold, files too deep or too large, and whatever
else one file does, are that file's one line; nothing of it is stored and the files after it are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convsweep.base.errors import StoreError, StoreUnavailable
from convsweep.store import ingest_files, ingest_result, open_store, read_result
from convsweep.base.strict_json import MAX_DEPTH, MAX_RESULT_BYTES, check_values, nesting_depth, read_json
from store_fixtures import as_format_1, make_job_file, make_result, row_counts, standard_results, write_results


@pytest.fixture
def engine(db_url):
    engine = open_store(db_url)
    yield engine
    engine.dispose()


def job_file_text(forward_ms: str) -> str:
    """A format 3 file whose first measurement's forward_ms is the literal `forward_ms`, as a
    hand-edited or corrupted file could hold it (json.dumps never writes these)."""
    job_file = make_job_file()
    job_file["measurements"][0]["timings"]["forward_ms"] = 1234.5
    text = json.dumps(job_file)
    assert text.count("1234.5") == 1
    return text.replace("1234.5", forward_ms)


def ingest_between_good_files(engine, directory: Path, bad_name: str, bad_text: str):
    """Ingest a good file, the bad one, another good file: (report, bad path)."""
    good = write_results(directory, standard_results()[:2])
    bad = directory / bad_name
    bad.write_text(bad_text, encoding="utf-8")
    return ingest_files(engine, [good[0], bad, good[1]]), bad


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1E400"])
def test_non_finite_numbers_are_refused_with_their_key(engine, tmp_path, literal):
    report, bad = ingest_between_good_files(engine, tmp_path / "results" / "x" / "runs", "j.json",
                                            job_file_text(literal))
    assert report.errors == [f"{bad}: measurements[0].timings.forward_ms: expected a finite number, got {literal}"]
    assert report.added == 2 and row_counts(engine)["run"] == 2  # the good files, nothing of j.json


@pytest.mark.parametrize("literal", ["-1.5", "-1e-9", "-0.0001"])
def test_negative_times_are_refused_by_the_schema(engine, tmp_path, literal):
    report, bad = ingest_between_good_files(engine, tmp_path, "j.json", job_file_text(literal))
    [error] = report.errors
    assert error.startswith(f"{bad}: measurements[0].timings.forward_ms: ") and json.dumps(float(literal)) in error
    assert "\n" not in error and report.added == 2 and row_counts(engine)["run"] == 2


@pytest.mark.parametrize("key, value, where", [
    ("samples", [{"metric": "forward_ms", "layer": None, "repeat": 0, "value": -0.5}], "samples[0].value"),
    ("samples", [{"metric": "forward_ms", "layer": None, "repeat": -1, "value": 0.5}], "samples[0].repeat"),
    ("accuracy", 1.5, "accuracy"),
    ("energy", {"joules": -1.0, "passes": 3, "joules_per_pass": 0.1}, "energy.joules"),
    ("phases_s", {"timed": -0.1}, "phases_s.timed"),
    ("clocks", {"sm_mhz": -1980, "memory_mhz": 2619}, "clocks.sm_mhz"),
])
def test_out_of_range_measurements_are_refused(engine, key, value, where):
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, make_result(**{key: value}), "f.json")
    assert str(caught.value).startswith(f"f.json: {where}: ") and "\n" not in str(caught.value)
    assert row_counts(engine)["run"] == 0


def test_huge_integers_are_refused_wherever_they_are(engine, tmp_path):
    """10^30 anywhere (here in a tunable, stored as JSON) is refused at parsing; one of 5,000 digits
    too, where Python's int() itself would raise ValueError."""
    result = make_result(params={"conv1": {"TILE": 16}, "conv2": {}})
    text = json.dumps(result).replace('"TILE": 16', '"TILE": 1' + "0" * 30)
    report, bad = ingest_between_good_files(engine, tmp_path, "big.json", text)
    assert report.errors == [f"{bad}: spec.params.conv1.TILE: expected a 64-bit integer, got 1{'0' * 30}"]
    bad.write_text(json.dumps(result).replace('"TILE": 16', '"TILE": -' + "9" * 5000), encoding="utf-8")
    [error] = ingest_files(engine, [bad]).errors
    assert error.startswith(f"{bad}: spec.params.conv1.TILE: expected a 64-bit integer, got -999") and len(error) < 200
    assert row_counts(engine)["run"] == 2


@pytest.mark.parametrize("section, key, value", [
    ("spec", "batch", 3_000_000_000),  # fits SQLite's INTEGER, not PostgreSQL's (32-bit)
    ("spec", "streams", 2**31),
    ("images", "unique", 2**31),
])
def test_integers_past_their_column_are_refused_on_both_databases(engine, section, key, value):
    result = make_result()
    result[section][key] = value
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, result, "f.json")
    assert str(caught.value).startswith(f"f.json: {section}.{key}: ") and str(value) in str(caught.value)
    assert row_counts(engine)["run"] == 0


def test_integers_past_bigint_are_refused(engine):
    result = make_result()
    result["floors"]["conv2"]["flops"] = 2**63
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, result, "f.json")
    assert str(caught.value) == f"f.json: floors.conv2.flops: expected a 64-bit integer, got {2**63}"
    result["floors"]["conv2"]["flops"] = 10**5000  # past what str() of an int will write
    with pytest.raises(StoreError, match=r"^f\.json: floors\.conv2\.flops: expected a 64-bit integer, "
                                         r"got an integer of 16610 bits$"):
        ingest_result(engine, result, "f.json")
    assert row_counts(engine)["run"] == 0


@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (float("inf"), "Infinity"),
                                          (-float("inf"), "-Infinity")])
def test_a_result_handed_in_as_a_dict_is_checked_for_non_finite_numbers(engine, value, shown):
    """JSON Schema's minimum passes NaN (every comparison with it is false) and inf: the check cannot."""
    result = make_result()
    result["samples"][3]["value"] = value
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, result, "f.json")
    assert str(caught.value) == f"f.json: samples[3].value: expected a finite number, got {shown}"
    assert row_counts(engine)["run"] == 0


def test_values_of_other_python_types_are_checked_too():
    """A dict handed to ingest_result may hold numpy scalars or tuples, which the fast check leaves
    to the exact one."""
    import numpy as np

    with pytest.raises(StoreError, match=r"^r: a\.b: expected a finite number, got NaN$"):
        check_values({"a": {"b": np.float64("nan")}}, "r")
    with pytest.raises(StoreError, match=r"^r: t\[1\]: expected a finite number, got -Infinity$"):
        check_values({"t": (1.0, -float("inf"))}, "r")
    with pytest.raises(StoreError, match=r"^r: \(top level\): expected a finite number, got NaN$"):
        check_values(float("nan"), "r")
    check_values({"a": (1, np.float32(2.5), None, "x", True), "b": 2**63 - 1, "c": -2**63}, "r")


def test_a_deeply_nested_file_is_refused_without_recursing(engine, tmp_path):
    deep = 200_000
    report, bad = ingest_between_good_files(engine, tmp_path, "deep.json", "[" * deep + "]" * deep)
    assert report.errors == [f"{bad}: not valid JSON: nested more than {MAX_DEPTH} levels deep"]
    assert report.added == 2
    # Brackets in strings are text, not nesting, escaped quotes and backslashes included.
    inside = {"format": 2, "x": {"y": "[" * 100_000 + '"\\' + "]" * 5}, 'k"[{\\': "\\"}
    assert nesting_depth(json.dumps(inside).encode(), MAX_DEPTH) == 2


def test_the_depth_limit_is_exact_and_also_holds_for_dicts(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert nesting_depth(path.read_bytes(), MAX_DEPTH) == MAX_DEPTH
    read_json(path)  # exactly the limit: read
    path.write_text('{"a": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}")
    with pytest.raises(StoreError, match=rf"^{path}: not valid JSON: nested more than {MAX_DEPTH} levels deep$"):
        read_json(path)
    nested: list = []
    for _ in range(MAX_DEPTH):
        nested = [nested]
    with pytest.raises(StoreError, match=rf"^r: (\[0\]){{{MAX_DEPTH}}}: nested more than {MAX_DEPTH} levels deep$"):
        check_values(nested, "r")


def test_a_file_past_the_size_cap_is_refused_unread(engine, tmp_path):
    good = write_results(tmp_path, standard_results()[:2])
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(MAX_RESULT_BYTES + 1)  # sparse: nothing written, and nothing read to refuse it
    report = ingest_files(engine, [good[0], huge, good[1]])
    assert report.errors == [f"{huge}: {MAX_RESULT_BYTES + 1:,} bytes; a result file holds at most "
                             f"{MAX_RESULT_BYTES:,}"]
    assert report.added == 2
    ten = tmp_path / "ten.json"
    ten.write_text("[1,2,3,4]\n")
    assert read_json(ten, max_bytes=10) == [1, 2, 3, 4]
    with pytest.raises(StoreError, match=rf"^{ten}: 10 bytes; a result file holds at most 9$"):
        read_json(ten, max_bytes=9)


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes('{"job_id": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(StoreError, match=rf"^{path}: not valid JSON: not UTF-8 \(invalid continuation byte at "
                                         r"byte 15\)$"):
        read_result(path)


def test_a_string_no_database_can_store_is_that_files_line(engine, tmp_path):
    """A lone surrogate (valid JSON escape, not encodable as UTF-8) failed both drivers outside
    their own error classes and stopped the ingest of every file after it."""
    bad = make_result("naive", 7)
    bad["job_id"] = "x\ud800"
    text = json.dumps(bad)
    assert "\\ud800" in text
    report, path = ingest_between_good_files(engine, tmp_path, "surrogate.json", text)
    [error] = report.errors
    assert error.startswith(f"{path}: cannot ingest: UnicodeEncodeError: ") and "\n" not in error
    assert report.added == 2 and row_counts(engine)["run"] == 2


@pytest.mark.parametrize("exc", [RecursionError("maximum recursion depth exceeded"), MemoryError(),
                                 OverflowError("Python int too large to convert to SQLite INTEGER"),
                                 ValueError("bad\nvalue"), KeyError("spec")])
def test_any_failure_while_storing_one_file_leaves_nothing_of_it_and_the_rest_go_on(engine, tmp_path, monkeypatch,
                                                                                  exc):
    """Raised late in the file's transaction, after its own sweep, environment and build rows were
    inserted: rolled back whole, the file's one line, and the next file stored."""
    import convsweep.measure.record as record

    real = record.conv_layers

    def failing(variants, floors, op_time_ms):
        if "poison" in variants.values():
            raise exc
        return real(variants, floors, op_time_ms)

    monkeypatch.setattr(record, "conv_layers", failing)
    bad = make_result("poison", 9, experiment="poisoned")
    bad["environment"]["hostname"] = "poisoned"
    paths = write_results(tmp_path, [bad, *standard_results()[:2]])
    report = ingest_files(engine, paths)
    assert report.added == 2 and len(report.errors) == 1
    error = report.errors[0]
    detail = " ".join(str(exc).split())
    assert error == f"{paths[0]}: cannot ingest: {type(exc).__name__}" + (f": {detail}" if detail else "")
    counts = row_counts(engine)
    assert (counts["run"], counts["sweep"], counts["environment"], counts["build"]) == (2, 1, 1, 1)


def test_a_database_that_cannot_be_used_still_stops_the_ingest(engine, tmp_path, monkeypatch):
    import convsweep.store.ingest as ingest

    def unavailable(*args):
        raise StoreUnavailable("database gone")

    monkeypatch.setattr(ingest, "_store", unavailable)
    with pytest.raises(StoreUnavailable, match="database gone"):
        ingest_files(engine, write_results(tmp_path, standard_results()[:2]))


def test_real_files_and_older_formats_still_read(engine):
    fixtures = sorted(Path(__file__).parent.glob("fixtures/gpu-results/*.json"))
    assert fixtures
    report = ingest_files(engine, fixtures)
    assert report.errors == [] and report.added > 0


def latest_runs(engine) -> list[tuple]:
    """(variant, batch, conv1 op time) of latest_run: each run_key's newest measurement."""
    from sqlalchemy import text

    with engine.connect() as connection:
        return sorted(connection.execute(text("SELECT variant, batch, op_time_1_ms FROM latest_run")).all())


def test_a_run_key_that_is_not_its_specs_is_that_files_line(engine, tmp_path):
    """The views take each run_key's newest row as its setting's latest measurement: a later file whose
    measurement claimed naive's key with tiled's spec hid naive's latest (issue 52)."""
    naive = make_result("naive", 100, op_time_ms=(0.5, 0.9))
    claimant = make_result("tiled", 100, op_time_ms=(9.0, 9.0), started_at="2026-11-23T18:40:00+00:00")
    claimant["run_key"] = naive["run_key"]
    honest = make_result("tiled", 1000, op_time_ms=(2.0, 3.0))
    paths = write_results(tmp_path, [naive, claimant, honest])
    report = ingest_files(engine, paths)
    spec_key = make_result("tiled", 100)["run_key"]
    assert report.errors == [f"{paths[1]}: run_key: {naive['run_key']!r} does not match its spec "
                             f"(whose key is {spec_key!r})"]
    assert report.added == 2 and row_counts(engine)["run"] == 2  # nothing of the claimant, the others stored
    assert latest_runs(engine) == [("naive", 100, 0.5), ("tiled", 1000, 2.0)]


@pytest.mark.parametrize("form", ["job file", "format 1"])
def test_each_measurements_run_key_is_checked_in_every_format(engine, form):
    if form == "job file":
        result, where = make_job_file(), "measurements[1]."
        result["measurements"][1]["spec"]["params"]["conv1"]["BLOCK"] = 512  # edited after its key was made
    else:
        result, where = as_format_1(make_result()), ""
        result["spec"]["batch"] = 101
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, result, "f.json")
    assert str(caught.value).startswith(f"f.json: {where}run_key: ") and "does not match its spec" in str(caught.value)
    assert row_counts(engine)["run"] == 0  # the file's other measurements neither

