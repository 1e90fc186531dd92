"""The named queries over runs the integrity checks judged (tests/fixtures/integrity-results), on both
backends: a suspect run is shown with its reason where runs are listed and never wins, and a run measured
with fast checks says so beside its times."""

from __future__ import annotations

import json

import pytest

from convsweep.device.floors import Ceiling, Work, work_floor_ms
from convsweep.analysis.query import run_query
from convsweep.store import ingest_result, open_store
from store_fixtures import as_reader, integrity_results

SUSPECT_REASON = "conv1 took 0.05 ms, below the physical floor of 0.1038 ms at this GPU's peak rates"


def stored(url: str, job_files: list[dict]) -> str:
    engine = open_store(url)
    for job_file in job_files:
        assert ingest_result(engine, job_file, None).added == len(job_file["measurements"])
    engine.dispose()
    return url


@pytest.fixture
def judged_url(db_url):
    """A database holding the integrity fixtures: naive BLOCK=64 ok, naive BLOCK=128 suspect (the fastest),
    tiled ok measured with fast checks (the fastest ok run)."""
    return stored(db_url, integrity_results())


def rows_of(url: str, name: str) -> list[dict]:
    return json.loads(run_query(as_reader(url), name, fmt="json"))


def by_time(rows: list[dict], column: str) -> dict[float, dict]:
    return {row[column]: row for row in rows}


def test_summary_shows_the_suspect_run_with_its_reason_and_marks_fast_checks(judged_url):
    rows = by_time(rows_of(judged_url, "summary"), "op time 1 (ms)")
    assert sorted(rows) == [0.05, 2.08, 7.3]
    assert rows[7.3]["verdict"] == ""
    assert rows[2.08]["verdict"] == "fast checks"
    suspect = rows[0.05]["verdict"]
    # The first of its reasons, cut so the table stays readable: `query failures` has them all
    assert suspect == f"suspect: {SUSPECT_REASON[:57]}..."
    table = run_query(as_reader(judged_url), "summary")
    assert "| suspect: conv1 took 0.05 ms" in table and "| fast checks " in table


def test_throughput_gives_each_time_over_its_floor_at_the_gpus_measured_rates(judged_url):
    """Nothing until the GPU's rates are stored; then each layer's op time over its floor at them. These
    files predate what a pass ships (images.input_bytes): their summary's forward × floor stays empty."""
    assert {r["× floor"] for r in rows_of(judged_url, "throughput")} == {None}
    engine = open_store(judged_url)
    ingest_result(engine, {"format": "bench-2", "bench_id": "b" * 32, "measured_at": "2026-11-26T06:00:00+00:00",
                           "device": integrity_results()[0]["measurements"][0]["environment"]["gpu"],
                           "ceilings": {"dtod_GBps": 3000.0, "h2d_GBps": 50.0,
                                        "matmul_TFLOPps": {"fp32": 50.0, "tf32": 400.0, "fp16": 700.0}}}, None)
    engine.dispose()
    rates = Ceiling(None, 3000e9, 50e9, None, {"fp32": 50e12, "tf32": 400e12, "fp16": 700e12})
    naive = next(m for job_file in integrity_results() for m in job_file["measurements"]
                 if m["spec"]["variants"]["conv1"] == "naive" and m["status"] == "ok")
    throughput = {(r["variant"], r["layer"], r["op time (ms)"]): r for r in rows_of(judged_url, "throughput")}
    for layer, ms in (("conv1", 7.3), ("conv2", 17.4)):
        work = naive["floors"][layer]  # no unit recorded: the fastest measured rate, so the floor errs low
        floor = work_floor_ms(rates, Work(work["bytes"], work["flops"]))
        assert throughput[("naive", layer, ms)]["× floor"] == f"{ms / floor:.2f}"
    summary = by_time(rows_of(judged_url, "summary"), "op time 1 (ms)")
    assert summary[7.3]["forward × floor"] is None


def test_best_never_picks_a_run_whose_timed_passes_were_not_all_on_unseen_inputs(db_url):
    """Stored before every pass was fresh (batch 10000 repeated round 0; fast checks had no fresh rounds): a
    memo could have served its passes, so it is not a winner, however fast."""
    files = integrity_results()
    tiled = files[1]["measurements"][0]
    tiled["integrity"]["fresh_passes"], tiled["integrity"]["rounds"] = 0, None
    best = rows_of(stored(db_url, files), "best")
    assert {(r["layer"], r["variant"]) for r in best if r["standing"] == "fastest"} == {("op time 1", "naive"),
                                                                                        ("op time 2", "naive")}


def test_what_a_runs_kernels_do_shows_beside_it_in_best_and_failures(db_url):
    """A finding (convsweep.device.findings) is not a verdict: the run stays the winner, with the finding beside it."""
    files = integrity_results()
    for job_file in files:
        for m in job_file["measurements"]:
            for build in m["builds"]:
                build["findings"] = {"conv_forward": ["global_write", "clock"] if m["spec"]["variants"]["conv1"] == "tiled"
                                     else []}
    url = stored(db_url, files)
    best = rows_of(url, "best")
    assert {r["findings"] for r in best} == {"conv_forward: writes module-scope global memory, reads %globaltimer or "
                                             "%clock"}
    (failure,) = rows_of(url, "failures")
    assert failure["findings"] == ""  # read, and nothing found


def test_best_never_picks_the_suspect_run_and_says_the_winner_had_fast_checks(judged_url):
    best = rows_of(judged_url, "best")
    assert [(r["layer"], r["standing"], r["variant"], r["checks"]) for r in best] == [
        ("op time 1", "fastest", "tiled", "fast"), ("op time 2", "fastest", "tiled", "fast")]


def test_best_picks_the_ok_setting_over_a_faster_suspect_one(db_url):
    naive = next(job_file for job_file in integrity_results() if job_file["job_id"].startswith("naive"))
    best = rows_of(stored(db_url, [naive]), "best")
    assert [(r["layer"], r["variant"], json.loads(r["tunables"]) if isinstance(r["tunables"], str) else r["tunables"],
             r["op time (ms)"], r["checks"]) for r in best] == [
        ("op time 1", "naive", {"BLOCK": 64}, 7.3, ""), ("op time 2", "naive", {"BLOCK": 64}, 17.4, "")]


def test_tuning_lists_the_suspect_setting_unranked_with_its_reason(judged_url):
    conv1 = [r for r in rows_of(judged_url, "tuning") if r["layer"] == "conv1"]
    assert [(r["variant"], r["rank"], r["status"], r["checks"]) for r in conv1] == [
        ("tiled", 1, "ok", "fast"), ("naive", 2, "ok", ""), ("naive", None, "suspect", "")]
    assert conv1[2]["error"] == SUSPECT_REASON[:77] + "..."  # cut, as an incorrect setting's is


def test_failures_and_runs_give_every_reason_of_a_suspect_run(judged_url):
    (failure,) = rows_of(judged_url, "failures")
    reasons = next(m for job_file in integrity_results() for m in job_file["measurements"]
                   if m["status"] == "suspect")["integrity"]["reasons"]
    assert failure["status"] == "suspect" and failure["error"] == "; ".join(reasons)
    assert reasons[0] == SUSPECT_REASON and reasons[2].startswith("caching test: sighting 2 of a round took")
    runs = rows_of(judged_url, "runs")
    assert sorted((r["status"], r["checks"]) for r in runs) == [("ok", "fast"), ("ok", "full"), ("suspect", "full")]


def test_tables_of_ok_runs_leave_the_suspect_run_out_and_mark_fast_checks(judged_url):
    for name, column in (("throughput", "op time (ms)"), ("transfers", "compute (ms)"), ("energy", "run_id"),
                         ("streams", "forward s1")):
        rows = rows_of(judged_url, name)
        assert len({row[column] for row in rows}) == len(rows) and rows, name
        assert sorted({(row["variant"], row["checks"]) for row in rows}) == [("naive", ""), ("tiled", "fast")], name
    assert sorted(r["status"] for r in rows_of(judged_url, "history")) == ["ok", "ok", "suspect"]
    (gpu,) = rows_of(judged_url, "gpus")
    assert (gpu["runs"], gpu["ok"], gpu["suspect"]) == (3, 2, 1)
