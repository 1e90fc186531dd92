"""Named and ad-hoc queries on both backends: results, formats, and a connection that cannot write."""

from __future__ import annotations

import csv
import io
import json
import re
import time

import pytest

from convsweep.base.axes import NAMES
from convsweep.base.errors import StoreError
from convsweep.base.fileio import canonical_hash
from convsweep.analysis.query import QUERIES_DIR, list_queries, render, run_query
from convsweep.store import ingest_result, open_store
from store_fixtures import (as_reader, every_layer, integrity_results, layer_floors, make_job_file, make_result,
                            row_counts, standard_results, with_one_result)

WRITES = [
    "UPDATE run SET status = 'ok'",
    "DELETE FROM sample",
    "DROP TABLE sample",
    "INSERT INTO sweep (experiment, config_hash, created_at) VALUES ('x', 'y', CURRENT_TIMESTAMP)",
    "CREATE TABLE intruder (id INTEGER)",
    "DROP VIEW run_summary",
]


@pytest.fixture(scope="module")
def loaded_url(module_db_url):
    """A database holding standard_results(): 4 ok runs, one incorrect, one failed. Made once per backend: its
    tests only query it, through a connection that cannot write (test_writes_are_refused_and_data_stays)."""
    engine = open_store(module_db_url)
    for result in standard_results():
        ingest_result(engine, result, None)
    engine.dispose()
    return module_db_url


def rows_of(url, sql_or_name, params=None):
    return json.loads(run_query(as_reader(url), sql_or_name, fmt="json", params=params))


def as_json(value):
    """A JSON column's value: SQLite hands it back as text, PostgreSQL as an object."""
    return json.loads(value) if isinstance(value, str) else value


def tuning_job_files():
    """Two cells (batch 100 and 1000) of one naive experiment, four settings each: BLOCK 32 and 64
    ok (64 faster on conv1, the two tied on conv2), 128 incorrect and the fastest, 256 failed."""
    files = []
    for batch in (100, 1000):
        scale = batch / 100
        files.append(make_job_file([
            make_result("naive", batch, params=every_layer(BLOCK=32), op_time_ms=(0.5 * scale, 0.7 * scale)),
            make_result("naive", batch, params=every_layer(BLOCK=64), op_time_ms=(0.4 * scale, 0.7 * scale)),
            make_result("naive", batch, params=every_layer(BLOCK=128), status="incorrect",
                        op_time_ms=(0.1 * scale, 0.2 * scale)),
            make_result("naive", batch, params=every_layer(BLOCK=256), status="failed"),
        ]))
    return files


@pytest.fixture
def tuned_url(db_url):
    """A database holding tuning_job_files()."""
    engine = open_store(db_url)
    for job_file in tuning_job_files():
        assert ingest_result(engine, job_file, None).added == 4
    engine.dispose()
    return db_url


def test_summary_is_the_seeds_table_of_ok_runs(loaded_url):
    rows = rows_of(loaded_url, "summary")
    # the cell: every axis, whether or not it varies (two runs differing only in timer never read as one)
    assert list(rows[0]) == ["experiment", "variant", *NAMES, "op time 1 (ms)", "op time 1 ±%", "op time 2 (ms)",
                             "op time 2 ±%", "forward (ms)", "forward ±%", "forward × floor", "total (s)", "accuracy",
                             "verdict"]
    assert {(r["input_format"], r["timer"]) for r in rows} == {("fp32", "events")}
    assert {r["forward × floor"] for r in rows} == {None}  # no floors stored
    assert [(r["variant"], r["batch"]) for r in rows] == [
        ("naive", 100), ("naive", 1000), ("tiled", 100), ("tiled", 1000)]
    assert rows[1]["op time 1 (ms)"] == pytest.approx(0.74)
    assert rows[1]["op time 2 (ms)"] == pytest.approx(1.76)
    assert rows[1]["accuracy"] == pytest.approx(0.982)
    # Beside each time its spread in %, one decimal: op time t sampled as t, t + 0.001, t + 0.002
    # (naive 100: 0.001 / 0.083 = 1.2%, 0.001 / 0.192 = 0.52%), forward as 42.1, 43.1, 44.1 (1 / 43.1 = 2.3%)
    assert [rows[0][f"{name} ±%"] for name in ("op time 1", "op time 2", "forward")] == ["1.2", "0.5", "2.3"]


def test_summary_table_pastes_into_markdown(loaded_url):
    table = run_query(as_reader(loaded_url), "summary")
    lines = table.splitlines()
    assert lines[0].startswith("| experiment ") and lines[0].endswith("|")
    assert set(lines[1]) <= set("|-: ")
    assert len(lines) == 2 + 4
    naive_1000 = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert naive_1000[1:] == ["naive", "1000", "1", "", "pageable", "fp32", "warm", "events", "0.7400", "0.1", "1.760",
                              "0.1", "6.500", "2.3", "", "6.200", "0.9820", ""]


def test_best_never_counts_incorrect_or_failed_runs(loaded_url):
    rows = rows_of(loaded_url, "best")
    best = {(r["layer"], r["batch"]): (r["variant"], r["op time (ms)"]) for r in rows}
    # fp16 (incorrect) is ten times faster at batch 1000; it must not win.
    assert best == {
        ("op time 1", 100): ("tiled", pytest.approx(0.060)),
        ("op time 1", 1000): ("tiled", pytest.approx(0.500)),
        ("op time 2", 100): ("tiled", pytest.approx(0.150)),
        ("op time 2", 1000): ("tiled", pytest.approx(1.20)),
    }
    # Beside each, its spread: op time t sampled as t, t + 0.001, t + 0.002 is 0.001 / (t + 0.001)
    assert [r["op time ±%"] for r in rows] == ["1.6", "0.2", "0.7", "0.1"]


def test_best_names_the_winning_tunables(db_url):
    engine = open_store(db_url)
    for block, op_ms in ((128, 0.9), (256, 0.7), (512, 0.8)):
        result = make_result("naive", batch=1000, op_time_ms=(op_ms, op_ms))
        result["spec"]["params"] = {"conv1": {"BLOCK": block}, "conv2": {"BLOCK": block}}
        result["run_key"] = canonical_hash(result["spec"])  # ingest holds the key to its spec
        ingest_result(engine, result, None)
    engine.dispose()
    rows = rows_of(db_url, "best")
    # That layer's tunables. SQLite hands JSON columns back as text, PostgreSQL as objects
    assert [as_json(r["tunables"]) for r in rows] == [{"BLOCK": 256}, {"BLOCK": 256}]


def test_best_ranks_every_conv_layer_of_a_deeper_network(db_url):
    engine = open_store(db_url)
    layers = ("conv1", "conv2", "conv3")
    for variant, op_ms in (("naive", (0.9, 0.8, 0.3)), ("tiled", (0.5, 0.6, 0.7))):
        ingest_result(engine, make_result(dict.fromkeys(layers, variant), batch=100, op_time_ms=op_ms), None)
    engine.dispose()
    best = [(r["layer"], r["variant"], r["op time (ms)"]) for r in rows_of(db_url, "best")]
    assert best == [("op time 1", "tiled", 0.5), ("op time 2", "tiled", 0.6), ("op time 3", "naive", 0.3)]


def test_tuning_ranks_every_setting_of_each_layer_and_batch(tuned_url):
    rows = rows_of(tuned_url, "tuning")
    assert list(rows[0]) == ["experiment", "layer", "batch", "variant", "tunables", "op time (ms)", "rank", "status",
                             "verdict", "error", "checks", *(name for name in NAMES if name != "batch"), "run_id"]
    table = [(r["layer"], r["batch"], as_json(r["tunables"])["BLOCK"], r["rank"], r["status"]) for r in rows]
    assert table == [
        # ok settings by rank (the incorrect one is faster, and never ranked); ties share one
        ("conv1", 100, 64, 1, "ok"), ("conv1", 100, 32, 2, "ok"), ("conv1", 100, 128, None, "incorrect"),
        ("conv1", 100, 256, None, "failed"),
        ("conv1", 1000, 64, 1, "ok"), ("conv1", 1000, 32, 2, "ok"), ("conv1", 1000, 128, None, "incorrect"),
        ("conv1", 1000, 256, None, "failed"),
        ("conv2", 100, 32, 1, "ok"), ("conv2", 100, 64, 1, "ok"), ("conv2", 100, 128, None, "incorrect"),
        ("conv2", 100, 256, None, "failed"),
        ("conv2", 1000, 32, 1, "ok"), ("conv2", 1000, 64, 1, "ok"), ("conv2", 1000, 128, None, "incorrect"),
        ("conv2", 1000, 256, None, "failed"),
    ]
    assert [r["op time (ms)"] for r in rows[:4]] == [pytest.approx(0.4), pytest.approx(0.5), pytest.approx(0.1), None]
    assert rows[2]["error"] == "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)"
    assert rows[3]["error"] == "compile failed: tiled.cu(12): error: identifier TILE undefined"
    assert {(r["variant"], r["streams"], r["host_memory"]) for r in rows} == {("naive", 1, "pageable")}


def test_tuning_shortens_long_errors_and_shows_tunables_as_json(db_url):
    engine = open_store(db_url)
    failed = make_result("naive", 100, status="failed", params=every_layer(BLOCK=64, UNROLL=2))
    failed["error"] = "compile failed: " + "x" * 100
    ingest_result(engine, make_job_file([failed]), None)
    engine.dispose()
    (row, _) = rows_of(db_url, "tuning")
    assert row["error"] == "compile failed: " + "x" * 61 + "..." and len(row["error"]) == 80
    table = run_query(as_reader(db_url), "tuning").splitlines()
    cells = [cell.strip() for cell in table[2].strip("|").split("|")]
    assert cells[4] == '{"BLOCK": 64, "UNROLL": 2}'  # on both backends, as JSON
    assert '{""BLOCK"": 64, ""UNROLL"": 2}' in run_query(as_reader(db_url), "tuning", fmt="csv")


def test_best_picks_the_fastest_ok_setting_of_a_job(tuned_url):
    rows = rows_of(tuned_url, "best")
    best = {(r["layer"], r["batch"]): (as_json(r["tunables"]), r["op time (ms)"]) for r in rows
            if r["standing"] == "fastest"}
    # The incorrect BLOCK 128 is faster everywhere: it never wins. On conv2 the tie goes to the first stored.
    assert best == {
        ("op time 1", 100): ({"BLOCK": 64}, pytest.approx(0.4)),
        ("op time 1", 1000): ({"BLOCK": 64}, pytest.approx(4.0)),
        ("op time 2", 100): ({"BLOCK": 32}, pytest.approx(0.7)),
        ("op time 2", 1000): ({"BLOCK": 32}, pytest.approx(7.0)),
    }
    # BLOCK 64 takes exactly as long on conv2: not a loser, a tie, listed under the winner
    tied = [(r["layer"], r["batch"], as_json(r["tunables"])) for r in rows if r["standing"] == "tied"]
    assert tied == [("op time 2", 100, {"BLOCK": 64}), ("op time 2", 1000, {"BLOCK": 64})]


def test_best_marks_the_settings_tied_with_the_winner_within_noise(db_url):
    engine = open_store(db_url)
    # medians 1.00, 1.015 and 1.10 ms, each sampled at -1%, 0, +1%: a 1% spread (median absolute deviation)
    for block, op_ms in ((128, 1.0), (256, 1.015), (512, 1.10)):
        result = make_result("naive", batch=1000, op_time_ms=(op_ms, op_ms), params=every_layer(BLOCK=block))
        result["samples"] = [{"metric": "op_time_ms", "layer": layer, "repeat": r, "value": op_ms * f}
                             for layer in ("conv1", "conv2") for r, f in enumerate((0.99, 1.0, 1.01))]
        ingest_result(engine, result, None)
    engine.dispose()
    rows = [(r["layer"], r["standing"], as_json(r["tunables"])["BLOCK"], r["op time ±%"]) for r in rows_of(db_url, "best")]
    # 1.015 - 1.00 is within 2 x (0.01 + 0.01015) ms; 1.10 is not
    assert rows == [("op time 1", "fastest", 128, "1.0"), ("op time 1", "tied", 256, "1.0"),
                    ("op time 2", "fastest", 128, "1.0"), ("op time 2", "tied", 256, "1.0")]


def test_streams_pivots_forward_time_and_overlap_by_stream_count(db_url):
    engine = open_store(db_url)
    for streams, forward, overlap in ((1, 29.6, 0.0), (2, 26.8, 0.5), (8, 24.4, 0.97)):
        for memory in ("pageable", "pinned"):
            result = make_result("naive", batch=10000, streams=streams, host_memory=memory)
            result["timings"].update(forward_ms=forward if memory == "pinned" else 2 * forward, overlap=overlap)
            ingest_result(engine, result, None)
    engine.dispose()
    rows = rows_of(db_url, "streams")
    assert [r["host_memory"] for r in rows] == ["pageable", "pinned"]
    pinned = rows[1]
    assert (pinned["forward s1"], pinned["forward s2"], pinned["forward s4"], pinned["forward s8"]) == (29.6, 26.8, None, 24.4)
    assert (pinned["overlap s1"], pinned["overlap s8"]) == (0.0, 0.97)


def test_cache_pairs_warm_and_cold_runs_of_one_cell_only(db_url):
    """A cold run pairs with the warm run that matches it on every other axis: the old hand-listed join paired
    an fp32 warm run with a u8 cold one, and a cold run with no warm twin is not a row."""
    engine = open_store(db_url)
    for cache, input_format, op_ms in (("warm", "fp32", 0.5), ("cold", "fp32", 0.8), ("cold", "u8", 0.9)):
        result = make_result("naive", 100, op_time_ms=(op_ms, op_ms))
        result["spec"].update({"cache": cache} if cache == "cold" else {})
        result["spec"].update({"input_format": input_format} if input_format != "fp32" else {})
        result["run_key"] = canonical_hash(result["spec"])
        assert ingest_result(engine, result, None).added == 1
    engine.dispose()
    rows = rows_of(db_url, "cache")
    assert [(r["layer"], r["input_format"], r["warm (ms)"], r["cold (ms)"]) for r in rows] == [
        ("conv1", "fp32", 0.5, 0.8), ("conv2", "fp32", 0.5, 0.8)]
    assert rows[0]["cold / warm"] == pytest.approx(1.6) and "cache" not in rows[0]


def test_phases_splits_each_runs_wall_time(db_url):
    engine = open_store(db_url)
    result = make_result("naive", batch=1000)
    ingest_result(engine, result, None)
    ingest_result(engine, make_result("broken", 100, status="failed"), None)  # failed runs are left out
    engine.dispose()
    (row,) = rows_of(db_url, "phases")
    assert (row["load"], row["compile"], row["timed"]) == tuple(result["phases_s"][k] for k in ("load", "compile", "timed"))
    assert row["nsys"] is None and row["variant"] == "naive"


def test_failures_and_runs_show_the_messages(loaded_url):
    failures = rows_of(loaded_url, "failures")
    assert {(r["variant"], r["status"]) for r in failures} == {("fp16", "incorrect"), ("broken", "failed")}
    assert any("identifier TILE undefined" in r["error"] for r in failures)
    runs = rows_of(loaded_url, "runs")
    assert len(runs) == 6
    assert {r["status"] for r in runs} == {"ok", "incorrect", "failed"}


def test_kernels_query(loaded_url):
    rows = rows_of(loaded_url, "kernels")
    assert len(rows) == 2 * 5
    naive = [r for r in rows if r["variant"] == "naive" and r["batch"] == 1000]
    assert [(r["layer"], r["kernel"], r["launches"], r["median (ms)"], r["registers"], r["shared_bytes"])
            for r in naive] == [("conv1", "naive_forward", 3, 0.74, 40, 1024),
                                ("conv2", "naive_forward", 3, 1.76, 40, 1024)]


def test_throughput_is_gflops_and_floor_bandwidth_per_ok_layer(loaded_url):
    rows = rows_of(loaded_url, "throughput")
    assert list(rows[0]) == ["experiment", "variant", "tunables (per layer)", *NAMES,
                             "layer", "op time (ms)", "GFLOP/s", "GB/s", "× floor", "checks", "run_id"]
    # Per layer and batch, fastest first; the incorrect fp16 and the failed run never show
    assert [(r["layer"], r["batch"], r["variant"]) for r in rows] == [
        (layer, batch, variant) for layer in ("conv1", "conv2") for batch in (100, 1000) for variant in ("tiled", "naive")]
    naive_1000_conv2 = rows[7]
    assert naive_1000_conv2["op time (ms)"] == pytest.approx(1.76)
    floors = layer_floors(1, 1000)
    assert floors["flops"] > 2**31
    assert naive_1000_conv2["GFLOP/s"] == pytest.approx(floors["flops"] / 1.76e-3 / 1e9)
    assert naive_1000_conv2["GB/s"] == pytest.approx(floors["bytes"] / 1.76e-3 / 1e9)
    tiled_100_conv1 = rows[0]
    assert tiled_100_conv1["GFLOP/s"] == pytest.approx(layer_floors(0, 100)["flops"] / (0.060 * 1e6))


def test_throughput_without_a_time_is_null_not_a_division_error(db_url):
    engine = open_store(db_url)
    ingest_result(engine, make_result("naive", 100, op_time_ms=(0.0, 0.5)), None)
    ingest_result(engine, make_result("tiled", 100, floors={}), None)
    engine.dispose()
    rows = {(r["variant"], r["layer"]): (r["GFLOP/s"], r["GB/s"]) for r in rows_of(db_url, "throughput")}
    assert rows == {
        ("naive", "conv1"): (None, None),
        ("naive", "conv2"): (pytest.approx(400_000_000 / 0.5e6), pytest.approx(8_001_000 / 0.5e6)),
        ("tiled", "conv1"): (None, None),
        ("tiled", "conv2"): (None, None),
    }


@pytest.mark.parametrize("name", [name for name, _ in list_queries()])
def test_every_named_query_runs(loaded_url, name):
    assert run_query(as_reader(loaded_url), name, fmt="csv").splitlines()[0]


def test_list_queries_describes_each_file():
    queries = dict(list_queries())
    assert {"summary", "runs", "best", "failures", "kernels", "throughput"} <= set(queries)
    for name, description in queries.items():
        assert description and not description.startswith("-"), name
        assert (QUERIES_DIR / f"{name}.sql").read_text().startswith(f"-- {description}")


@pytest.mark.parametrize("sql", WRITES)
def test_writes_are_refused_and_data_stays(loaded_url, sql):
    before = rows_of(loaded_url, "runs")
    with pytest.raises(StoreError, match=r"^read-only connection: ") as caught:
        run_query(as_reader(loaded_url), sql)
    assert "\n" not in str(caught.value)
    assert rows_of(loaded_url, "runs") == before
    engine = open_store(loaded_url)
    assert row_counts(engine)["sample"] == 4 * 9 + 9
    engine.dispose()


@pytest.mark.parametrize("sql", [
    "SELECT 1; UPDATE run SET status = 'ok'",
    "COMMIT; SET default_transaction_read_only = off; UPDATE run SET status = 'ok'",
])
def test_several_statements_in_one_string_cannot_write(loaded_url, sql):
    with pytest.raises(StoreError):
        run_query(as_reader(loaded_url), sql)
    assert {r["status"] for r in rows_of(loaded_url, "runs")} == {"ok", "incorrect", "failed"}


def test_formats(loaded_url):
    sql = "SELECT variant, batch, op_time_1_ms FROM run_summary WHERE status = 'ok' ORDER BY variant, batch"
    parsed = list(csv.DictReader(io.StringIO(run_query(as_reader(loaded_url), sql, fmt="csv"))))
    assert parsed[0] == {"variant": "naive", "batch": "100", "op_time_1_ms": "0.082"}
    as_json = rows_of(loaded_url, sql)
    assert as_json[0] == {"variant": "naive", "batch": 100, "op_time_1_ms": 0.082}
    with pytest.raises(StoreError, match="unknown output format 'xml'"):
        run_query(as_reader(loaded_url), sql, fmt="xml")


def test_sql_file_path(loaded_url, tmp_path):
    path = tmp_path / "mine.sql"
    path.write_text("-- How many runs?\nSELECT COUNT(*) AS runs FROM run\n", encoding="utf-8")
    assert rows_of(loaded_url, str(path)) == [{"runs": 6}]


def test_a_query_file_may_name_the_cell_and_typed_sql_is_left_as_it_is(loaded_url, tmp_path):
    """{cell} and {cell_order} (qualified, with axes left out) are written out from the axes in a query file, a
    named one or a path; an axis that does not exist is the file's one line; SQL typed in full is never touched."""
    path = tmp_path / "cells.sql"
    path.write_text("SELECT variant, {r.cell} FROM latest_run r WHERE r.trusted = 1 ORDER BY r.variant, {r.cell_order}",
                    encoding="utf-8")
    rows = rows_of(loaded_url, str(path))
    assert list(rows[0]) == ["variant", *NAMES] and [(r["variant"], r["batch"]) for r in rows] == [
        ("naive", 100), ("naive", 1000), ("tiled", 100), ("tiled", 1000)]
    path.write_text("SELECT {cell except warmth} FROM latest_run", encoding="utf-8")
    with pytest.raises(StoreError, match=r"cells\.sql: \{cell except warmth\}: no axis named warmth"):
        run_query(as_reader(loaded_url), str(path))
    assert rows_of(loaded_url, "SELECT '{cell}' AS braces") == [{"braces": "{cell}"}]


def test_summary_tells_two_runs_of_one_cell_apart_by_their_timer(db_url):
    """Issue 53's table: events 5.0 ms and graph 3.0 ms of one cell printed as two rows identical but for the time."""
    engine = open_store(db_url)
    for timer, forward_ms in (("events", 5.0), ("graph", 3.0)):
        result = make_result("naive", 1000, host_memory="pinned")
        if timer != "events":  # a spec leaves an axis at its default out
            result["spec"]["timer"] = timer
            result["run_key"] = canonical_hash(result["spec"])
        result["timings"]["forward_ms"] = forward_ms
        assert ingest_result(engine, result, None).added == 1
    engine.dispose()
    rows = rows_of(db_url, "summary")
    assert [(r["host_memory"], r["timer"], r["forward (ms)"]) for r in rows] == [("pinned", "events", 5.0),
                                                                                ("pinned", "graph", 3.0)]


def test_a_run_not_every_pass_of_which_was_fresh_is_a_failure_and_never_ranked(db_url):
    """The views' trusted: a run some of whose timed passes ran on inputs its kernel had seen is out of best
    (as before) and now out of every ranking and rate too; failures and summary say why."""
    found = integrity_results()[0]["measurements"][0]["integrity"]
    engine = open_store(db_url)
    ingest_result(engine, make_result("naive", 100, op_time_ms=(0.5, 0.9), integrity=found), None)
    ingest_result(engine, make_result("stale", 100, op_time_ms=(0.1, 0.2), integrity={**found, "fresh_passes": 1}),
                  None)
    engine.dispose()
    failures = rows_of(db_url, "failures")
    assert [(r["variant"], r["status"], r["verdict"]) for r in failures] == [("stale", "ok", "not-fresh")]
    for name in ("best", "throughput", "transfers", "streams", "energy"):
        assert {r["variant"] for r in rows_of(db_url, name)} == {"naive"}, name
    assert {(r["variant"], r["rank"], r["verdict"]) for r in rows_of(db_url, "tuning")} == {
        ("naive", 1, "ok"), ("stale", None, "not-fresh")}
    assert {(r["variant"], r["verdict"]) for r in rows_of(db_url, "summary")} == {("naive", ""), ("stale", "not fresh")}


def test_parameters_bind(loaded_url):
    rows = rows_of(loaded_url, "SELECT variant FROM run WHERE batch = :batch AND status = :status ORDER BY variant",
                   params={"batch": 1000, "status": "ok"})
    assert rows == [{"variant": "naive"}, {"variant": "tiled"}]


def test_sql_errors_are_one_line(loaded_url):
    with pytest.raises(StoreError, match=r"^query failed: ") as caught:
        run_query(as_reader(loaded_url), "SELECT no_such_column FROM run")
    assert "\n" not in str(caught.value)


def test_unknown_query_name_lists_the_known_ones(loaded_url):
    with pytest.raises(StoreError, match=r"no query named 'sumary' .*known: .*summary"):
        run_query(as_reader(loaded_url), "sumary")


def test_missing_sqlite_database(tmp_path):
    missing = tmp_path / "db" / "results.sqlite"
    with pytest.raises(StoreError, match=rf"^no database at {missing}: run a sweep first$"):
        run_query(f"sqlite:///{missing}", "summary")
    assert not missing.exists()


def test_unreachable_postgresql_fails_fast():
    start_s = time.monotonic()
    with pytest.raises(StoreError, match=r"^database postgresql\+psycopg://u:\*\*\*@127.0.0.1:1/x unreachable: "):
        run_query("postgresql://u:pw@127.0.0.1:1/x", "summary")
    assert time.monotonic() - start_s < 6


def test_empty_result_and_float_cells():
    assert render(["a", "b"], [], "table").splitlines()[0].startswith("| a")
    table = render(["ms", "n", "err"], [(17.4, 3, 3.1e-7), (1234.5678, None, 0.0)], "table")
    assert "17.40" in table and "1235" in table and "3.100e-07" in table
    assert json.loads(render(["x"], [(None,)], "json")) == [{"x": None}]


def test_json_values_render_as_json():
    """PostgreSQL hands JSON columns back as Python objects: tables and CSV show them as JSON."""
    table = render(["tunables", "grid"], [({"BLOCK": 64}, [1, 2])], "table")
    assert '| {"BLOCK": 64} | [1, 2] |' in table
    assert render(["tunables"], [({"BLOCK": 64},)], "csv") == 'tunables\n"{""BLOCK"": 64}"\n'
    assert json.loads(render(["tunables"], [({"BLOCK": 64},)], "json")) == [{"tunables": {"BLOCK": 64}}]


# --- read-only in depth ---------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path):
    return with_one_result(f"sqlite:///{tmp_path / 'db' / 'results.sqlite'}")


@pytest.fixture
def pg_url(empty_pg_url):
    return with_one_result(empty_pg_url)


def test_sqlite_attach_is_refused_and_creates_no_file(sqlite_url, tmp_path):
    target = tmp_path / "created-by-attach.sqlite"
    with pytest.raises(StoreError, match=r"^read-only connection: "):
        run_query(sqlite_url, f"ATTACH DATABASE '{target}' AS other")
    # The authorizer refuses it too, below the statement check
    from convsweep.analysis.query import _read_only_engine
    from convsweep.store import resolve_url
    from sqlalchemy.exc import DBAPIError

    engine = _read_only_engine(resolve_url(sqlite_url))
    with engine.connect() as connection, pytest.raises(DBAPIError, match="not authorized"):
        connection.exec_driver_sql(f"ATTACH DATABASE '{target}' AS other")
    engine.dispose()
    assert not target.exists()


@pytest.mark.parametrize("sql, refused", [
    ("PRAGMA user_version = 7", "PRAGMA user_version = 7"),
    ("PRAGMA journal_mode = DELETE", "PRAGMA journal_mode = DELETE"),
    ("PRAGMA writable_schema = ON", "PRAGMA writable_schema = ON"),
    ("PRAGMA query_only = OFF", "PRAGMA query_only = OFF"),
    ("SELECT load_extension('/nonexistent/evil')", "the function load_extension()"),
])
def test_sqlite_pragmas_that_write_and_extensions_are_refused(sqlite_url, sql, refused):
    with pytest.raises(StoreError, match=rf"^read-only connection: {re.escape(refused)} is not allowed$"):
        run_query(sqlite_url, sql)
    assert rows_of(sqlite_url, "PRAGMA user_version") == [{"user_version": 0}]


def test_sqlite_pragmas_that_only_read_are_allowed(sqlite_url):
    columns = {row["name"] for row in rows_of(sqlite_url, "PRAGMA table_info(run)")}
    assert {"run_key", "measurement_id", "source_hash"} <= columns
    assert rows_of(sqlite_url, "PRAGMA journal_mode") == [{"journal_mode": "wal"}]


def test_sqlite_vacuum_into_writes_no_file(sqlite_url, tmp_path):
    target = tmp_path / "copy.sqlite"
    with pytest.raises(StoreError, match=r"^read-only connection: "):
        run_query(sqlite_url, f"VACUUM INTO '{target}'")
    assert not target.exists()


def test_postgresql_copy_to_a_file_is_refused(pg_url, tmp_path):
    target = tmp_path / "leak.csv"
    with pytest.raises(StoreError, match=r"^read-only connection: .*got COPY"):
        run_query(as_reader(pg_url), f"COPY (SELECT * FROM run) TO '{target}'")
    assert not target.exists()


def test_postgresql_server_files_are_out_of_reach(pg_url, tmp_path):
    with pytest.raises(StoreError, match=r"^read-only connection: permission denied for function pg_read_file"):
        run_query(as_reader(pg_url), "SELECT pg_read_file('/etc/hostname')")
    target = tmp_path / "exported.bin"
    with pytest.raises(StoreError, match=r"^read-only connection: permission denied for function lo_export"):
        run_query(as_reader(pg_url), f"SELECT lo_export(1, '{target}')")
    assert not target.exists()
    with pytest.raises(StoreError, match=r"^read-only connection: .*got DO"):
        run_query(as_reader(pg_url), "DO $$ BEGIN PERFORM pg_read_file('/etc/hostname'); END $$")


def test_sqlite_authorizer_names_what_it_refused(sqlite_url):
    """Below the statement check: a write reaches the authorizer, which refuses it and says what it was."""
    from sqlalchemy.exc import DBAPIError

    from convsweep.analysis.query import _read_only_engine
    from convsweep.store import resolve_url

    engine = _read_only_engine(resolve_url(sqlite_url))
    with engine.connect() as connection:
        for sql, refused in (("CREATE INDEX ix_intruder ON run (batch)", "insert on sqlite_master"),
                             ("DELETE FROM sample", "delete on sample"),
                             ("DROP TABLE sample", "delete on sqlite_master")):
            connection.info["refused"].clear()
            with pytest.raises(DBAPIError, match="not authorized"):
                connection.exec_driver_sql(sql)
            assert connection.info["refused"][0] == refused
    engine.dispose()


def test_gpus_counts_the_runs_each_gpu_measured(db_url):
    engine = open_store(db_url)
    for i, batch in enumerate((100, 1000, 10000)):
        result = make_result("naive", batch)
        result["environment"]["gpu_uuid"] = f"GPU-{'ab'[i % 2]}"
        assert ingest_result(engine, make_job_file([result]), None).added == 1
    engine.dispose()
    rows = rows_of(db_url, "gpus")
    assert [(r["gpu_uuid"], r["runs"], r["ok"]) for r in rows] == [("GPU-a", 2, 2), ("GPU-b", 1, 1)]


def test_a_database_of_an_older_schema_is_migrated_before_a_query_reads_it(tmp_path):
    """A store an older convsweep left (0018: no `trusted`, `verdict` or `timer` in its views) answered every named
    query with `no such column` until something opened it for writing; now the query brings it up first, and one
    that cannot be written says so in one line."""
    import os

    from convsweep.store import migrate
    from convsweep.store.engine import SCHEMA_REVISION

    path = tmp_path / "old.sqlite"
    url = f"sqlite:///{path}"
    engine = open_store(url)
    ingest_result(engine, make_result(), None)
    migrate(engine, "0018", downgrade=True)
    engine.dispose()
    assert len(rows_of(url, "summary")) == 1
    with open_store(url).connect() as connection:
        assert connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == SCHEMA_REVISION

    engine = open_store(url)
    migrate(engine, "0018", downgrade=True)
    engine.dispose()
    os.chmod(path, 0o444)
    with pytest.raises(StoreError) as caught:
        run_query(url, "summary")
    said = str(caught.value)
    assert "\n" not in said and "no such column" in said and "at schema 0018" in said and "read-only" in said
    assert "convsweep ingest" in said
