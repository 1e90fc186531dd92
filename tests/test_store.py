"""The result store on SQLite and PostgreSQL: schema, idempotent ingest, atomicity, errors."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from jsonschema import Draft202012Validator
from sqlalchemy import Connection, Engine, MetaData, Table, delete, func, insert, inspect, select
from sqlalchemy.orm import Session

from convsweep.base.axes import NAMES
from convsweep.app.cli import main as cli_main
from convsweep.sweep.config import JobSpec, RunSpec
from convsweep.base.errors import StoreError
from convsweep.sweep.config import variant_label
from convsweep.base.fileio import canonical_hash
from convsweep.measure.job import run_job
from convsweep.analysis.query import run_query
from convsweep.measure.record import FORMAT, ResultFile
from convsweep.base.paths import MIGRATIONS_DIR
from convsweep.base.schema import load_schema
from convsweep.store.engine import SCHEMA_REVISION
from convsweep.store import (
    Base,
    Build,
    LayerTime,
    Run,
    Sample,
    alembic_config,
    ingest_files,
    ingest_result,
    make_engine,
    migrate,
    open_store,
    read_result,
    resolve_url,
    sqlite_path,
)
from convsweep.base.errors import StoreUnavailable
from convsweep.store.engine import _writer
from convsweep.store.ingest import _run_row
from store_fixtures import (
    as_format_1,
    as_reader,
    every_layer,
    integrity_results,
    make_job_file,
    make_result,
    row_counts,
    standard_results,
    tuning_results,
    write_results,
)

RUN_SUMMARY_0001_COLUMNS = [
    "experiment", "variant", "batch", "streams", "host_memory", "status", "op_time_1_ms",
    "op_time_2_ms", "forward_ms", "total_s", "accuracy", "max_rel_err", "profiler", "run_id",
]
RUN_SUMMARY_0002_COLUMNS = RUN_SUMMARY_0001_COLUMNS[:-1] + ["prediction_agreement", "run_id"]
RUN_SUMMARY_0003_COLUMNS = RUN_SUMMARY_0002_COLUMNS[:-1] + ["job_id", "started_at", "run_id"]
RUN_SUMMARY_0006_COLUMNS = RUN_SUMMARY_0003_COLUMNS + ["op_time_1_spread", "op_time_2_spread", "forward_spread"]
RUN_SUMMARY_0011_COLUMNS = RUN_SUMMARY_0006_COLUMNS + ["cache", "note"]
RUN_SUMMARY_0012_COLUMNS = RUN_SUMMARY_0011_COLUMNS + ["error", "checks"]
RUN_SUMMARY_0013_COLUMNS = RUN_SUMMARY_0012_COLUMNS + ["input_format", "forward_floor_ms"]
RUN_SUMMARY_0018_COLUMNS = RUN_SUMMARY_0013_COLUMNS + ["compute_ms", "compute_floor_ms"]
# 0019: the cell is every axis, after the experiment and the variant; then what a run's number is worth
RUN_SUMMARY_COLUMNS = ["experiment", "variant", *NAMES, "status", "trusted", "verdict"] + [
    c for c in RUN_SUMMARY_0018_COLUMNS if c not in ("experiment", "variant", "status", *NAMES)]
LATEST_RUN_0004_OWN_COLUMNS = ["measurement_rank", "op_time_1_ms", "op_time_2_ms"]
LATEST_RUN_0019_OWN_COLUMNS = ["verdict", "trusted"]


@pytest.fixture
def engine(db_url):
    engine = open_store(db_url)
    yield engine
    engine.dispose()


def ingest_at_once(engine: Engine, results: list) -> tuple[list, list]:
    """Ingest each result on a thread of its own, all released together: (reports, StoreErrors)."""
    barrier = threading.Barrier(len(results))
    reports, errors = [], []

    def ingest(result):
        barrier.wait()
        try:
            reports.append(ingest_result(engine, result, None))
        except StoreError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ingest, args=(r,)) for r in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return reports, errors


def test_migration_matches_models(engine):
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == []
        assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
        assert_latest_run_shows_every_run_column(connection)


def assert_latest_run_shows_every_run_column(connection: Connection) -> None:
    """latest_run answers with every column of run, whatever revision added it, then its own
    (PostgreSQL expands its r.* when the view is created)."""
    shown = list(connection.exec_driver_sql("SELECT * FROM latest_run WHERE 1 = 0").keys())
    run_columns = [c["name"] for c in inspect(connection).get_columns("run")]
    assert {"job_key", "grid", "forward_spread"} <= set(run_columns)
    judged = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() >= "0019"
    assert shown == run_columns + LATEST_RUN_0004_OWN_COLUMNS + ["op_time_1_spread", "op_time_2_spread"] + (
        LATEST_RUN_0019_OWN_COLUMNS if judged else [])


def test_schema_revision_is_alembics_head():
    """engine.SCHEMA_REVISION lets an up-to-date database open without Alembic: it must name the
    newest migration, or a new migration would never run."""
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    assert SCHEMA_REVISION == scripts.get_current_head()
    # It is read from the files' names: each file is named for its revision.
    assert all(Path(script.path).name.startswith(f"{script.revision}_") for script in scripts.walk_revisions())


def test_opening_an_up_to_date_store_does_not_import_alembic(db_url):
    open_store(db_url).dispose()
    code = ("import sys; from convsweep.store import open_store; open_store(sys.argv[1]).dispose(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'numpy', 'jsonschema')))")
    out = subprocess.run([sys.executable, "-c", code, db_url], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_open_store_twice_is_a_no_op(db_url):
    first = open_store(db_url)
    ingest_result(first, make_result())
    first.dispose()
    second = open_store(db_url)
    assert row_counts(second)["run"] == 1
    second.dispose()


def test_sqlite_is_wal_with_foreign_keys(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 'new' / 'dir' / 'results.sqlite'}")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()
    assert (tmp_path / "new" / "dir" / "results.sqlite").is_file()


def test_default_url_is_env_then_db_results_sqlite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVSWEEP_DB", raising=False)
    open_store(None).dispose()
    assert (tmp_path / "db" / "results.sqlite").is_file()
    monkeypatch.setenv("CONVSWEEP_DB", f"sqlite:///{tmp_path / 'elsewhere.sqlite'}")
    assert resolve_url(None).database == str(tmp_path / "elsewhere.sqlite")
    assert resolve_url("postgresql://u@h/x").drivername == "postgresql+psycopg"


@contextmanager
def chmodded(path: Path, mode: int):
    old = path.stat().st_mode
    path.chmod(mode)
    try:
        yield
    finally:
        path.chmod(old)


UNSTORED = "a sweep could not store its results"


def test_a_read_only_sqlite_file_is_refused_before_any_job_and_queries_still_read_it(tmp_path, monkeypatch):
    """Before, SQLite opened it read-only without a word and the sweep failed at its first ingest.
    The check also holds for root (who may write anything: tests here run as root), since a
    file without any write bit was marked read-only on purpose."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVSWEEP_DB", raising=False)
    engine = open_store(None)
    ingest_result(engine, make_result())
    engine.dispose()
    path = Path("db/results.sqlite")
    before = path.read_bytes()
    with chmodded(path, 0o444):
        with pytest.raises(StoreUnavailable) as caught:
            open_store(None)
        assert str(caught.value) == f"db/results.sqlite: read-only (mode 0444): {UNSTORED}"
        assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["results.sqlite"]
        assert run_query(None, "SELECT count(*) AS runs FROM run", "csv").split() == ["runs", "1"]


@pytest.mark.parametrize("exists", [True, False])
def test_a_database_in_a_read_only_directory_names_the_directory(tmp_path, exists):
    directory = tmp_path / "db"
    path = directory / "results.sqlite"
    directory.mkdir()
    if exists:
        open_store(f"sqlite:///{path}").dispose()
    files = "results.sqlite-wal and -shm" if exists else "results.sqlite and its -wal and -shm"
    with chmodded(directory, 0o555):
        with pytest.raises(StoreUnavailable) as caught:
            open_store(f"sqlite:///{path}")
    assert str(caught.value) == (f"{directory}: directory read-only (mode 0555): SQLite creates {files} there, "
                                 f"so {UNSTORED}")
    assert path.exists() == exists


@pytest.mark.parametrize("cause, message", [
    ("access", "not writable by this user (mode 0644, owner {owner})"),
    ("statvfs", "on a read-only file system"),
])
def test_a_database_this_user_cannot_write_is_refused(tmp_path, monkeypatch, cause, message):
    """What a user who does not own the file, or a read-only mount, gets. Faked: as root here
    os.access allows everything, and mounting needs privileges the tests do not have."""
    import pwd
    from types import SimpleNamespace

    path = tmp_path / "results.sqlite"
    open_store(f"sqlite:///{path}").dispose()
    path.chmod(0o644)
    if cause == "access":
        monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != path)
    else:
        real = os.statvfs
        read_only = SimpleNamespace(f_flag=os.ST_RDONLY)
        monkeypatch.setattr(os, "statvfs", lambda p: read_only if Path(p) == path else real(p))
    with pytest.raises(StoreUnavailable) as caught:
        open_store(f"sqlite:///{path}")
    owner = pwd.getpwuid(path.stat().st_uid).pw_name
    assert str(caught.value) == f"{path}: {message.format(owner=owner)}: {UNSTORED}"


def test_a_read_only_sqlite_connection_is_refused_by_a_write_that_changes_nothing(tmp_path):
    """A mode=ro URI passes every file check (the file is writable) and opened without a word."""
    path = tmp_path / "results.sqlite"
    open_store(f"sqlite:///{path}").dispose()
    before = path.read_bytes()
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with pytest.raises(StoreUnavailable) as caught:
        open_store(url)
    assert str(caught.value) == f"{url}: cannot write (attempt to write a readonly database): {UNSTORED}"
    assert path.read_bytes() == before


def test_ingest_stores_everything(engine):
    result = make_result({"conv1": "naive", "conv2": "tiled"}, batch=1000, op_time_ms=(0.74, 1.2))
    assert ingest_result(engine, result, "results/x/runs/a.json").added == 1
    counts = row_counts(engine)
    assert counts == {"sweep": 1, "environment": 1, "build": 2, "run": 1, "run_build": 2,
                      "sample": 9, "kernel": 2, "memcpy": 2, "layer_time": 2}
    with Session(engine) as session:
        run = session.scalars(select(Run)).one()
        assert run.variant == "conv1=naive,conv2=tiled"
        # layer_time is where op times live; its first two positions are the seeds' op time 1 and 2
        assert [(t.layer_index, t.layer, t.op_time_ms) for t in run.layer_times] == [(0, "conv1", 0.74), (1, "conv2", 1.2)]
        assert run.batch == 1000 and run.status == "ok" and run.profiler_requested == "nsys"
        assert run.result_path == "results/x/runs/a.json"
        started_at = run.started_at
        if started_at.tzinfo is not None:  # PostgreSQL answers in the session's time zone
            started_at = started_at.astimezone(timezone.utc).replace(tzinfo=None)
        assert started_at.isoformat() == "2026-11-22T18:40:00"
        assert sorted(b.variant for b in run.builds) == ["naive", "tiled"]
        assert run.environment.packages == {"numpy": "2.1.0", "cuda-core": "0.4.0"}
        assert sorted(k.layer for k in run.kernels) == ["conv1", "conv2"]
        assert {m.kind: m.bytes for m in run.memcpys}["H2D"] == 14792000 * 2
        assert [s.value for s in run.samples if s.metric == "forward_ms"] == [42.1, 43.1, 44.1]
        assert run.prediction_agreement == 0.9996
        # conv2's 4e9 flops need the BIGINT
        assert sorted((t.layer, t.op_time_ms, t.flops, t.bytes) for t in run.layer_times) == [
            ("conv1", 0.74, 2_000_000_000, 40_001_000), ("conv2", 1.2, 4_000_000_000, 80_001_000)]
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT op_time_1_ms, op_time_2_ms FROM run_summary").one() == (0.74, 1.2)


def test_ingest_stores_phases_chunk_size_and_each_layers_variant(engine):
    result = make_result({"conv1": "naive", "conv2": "tiled"}, batch=1000)
    result["spec"]["chunk_images"] = 250
    result["run_key"] = canonical_hash(result["spec"])  # a setting's key is its spec's (ingest checks it)
    ingest_result(engine, result, None)
    ingest_result(engine, make_result("naive", 100), None)  # automatic chunking: no chunk_images key
    with Session(engine) as session:
        mixed, plain = session.scalars(select(Run).order_by(Run.batch.desc())).all()
        assert {p.name: p.seconds for p in mixed.phase_times} == result["phases_s"]
        assert (mixed.chunk_images, plain.chunk_images) == (250, None)
        assert {t.layer: t.variant for t in mixed.layer_times} == {"conv1": "naive", "conv2": "tiled"}


def test_ingest_stores_the_passes_taken_and_why_they_stopped(engine):
    auto = make_result("naive", 100)
    auto["spec"]["repeats"] = "auto"
    auto["spec"]["stopping"] = {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.5, "timeout_s": 15}
    auto["run_key"] = canonical_hash(auto["spec"])
    auto["stopping"] = {"rule": "auto", "reason": "converged", "samples": 37, "noise": 0.002, "measured_s": 0.6}
    fixed = make_result("naive", 200)
    fixed["stopping"] = {"rule": "fixed", "reason": "fixed", "samples": 3, "noise": 0.01, "measured_s": 0.1}
    for result in (auto, fixed, make_result("naive", 300)):  # the last: written before the stopping rule
        ingest_result(engine, result, None)
    with Session(engine) as session:
        rows = session.execute(select(Run.batch, Run.repeats, Run.stop_reason).order_by(Run.batch)).all()
    assert [tuple(r) for r in rows] == [(100, 37, "converged"), (200, 3, "fixed"), (300, 3, None)]


def test_ingest_stores_the_relative_spread_of_each_median(engine):
    """Spread: the samples' median absolute deviation over their median; null without samples."""
    def samples(metric: str, layer: str | None, values: list[float]) -> list[dict[str, Any]]:
        return [{"metric": metric, "layer": layer, "repeat": r, "value": v} for r, v in enumerate(values)]

    result = make_result("naive", 100)
    result["samples"] = (samples("op_time_ms", "conv1", [1.0, 1.1, 0.9, 1.0, 5.0])
                         + samples("forward_ms", None, [10.0, 12.0, 8.0]) + samples("h2d_ms", None, [3.0, 9.0, 3.0]))
    ingest_result(engine, result, None)
    ingest_result(engine, make_result("broken", 200, status="failed"), None)  # no samples
    with Session(engine) as session:
        timed, failed = session.scalars(select(Run).order_by(Run.batch)).all()
        # conv1: median 1.0, deviations 0, 0.1, 0.1, 0, 4 (the outlier does not widen it); conv2 has no samples
        assert [(t.layer, t.op_time_spread) for t in timed.layer_times] == [("conv1", pytest.approx(0.1)),
                                                                             ("conv2", None)]
        assert timed.forward_spread == pytest.approx(0.2)  # median 10, deviations 0, 2, 2
        assert failed.forward_spread is None and [t.op_time_spread for t in failed.layer_times] == [None, None]
    with engine.connect() as connection:
        assert connection.exec_driver_sql(
            "SELECT op_time_1_spread, op_time_2_spread, forward_spread FROM run_summary WHERE batch = 100").one() \
            == (pytest.approx(0.1), None, pytest.approx(0.2))


def test_failed_runs_keep_their_floors_in_layer_time(engine):
    ingest_result(engine, make_result("broken", 100, status="failed"), None)
    # A job that failed before it knew its shapes writes "floors": {} (convsweep/measure/job.py)
    ingest_result(engine, make_result("broken", 200, status="failed", floors={}), None)
    # Floors and op times may name a layer spec.variants does not: it gets a row too, after the
    # layers of spec.variants (op times' layers first)
    extra = make_result("naive", 300)
    extra["floors"]["conv3"] = {"bytes": 7, "flops": 9}
    extra["timings"]["op_time_ms"]["conv4"] = 0.5
    ingest_result(engine, extra, None)
    assert layer_rows(engine) == {
        ("broken", 100, 0, "conv1", None, 200_000_000, 4_001_000),
        ("broken", 100, 1, "conv2", None, 400_000_000, 8_001_000),
        ("broken", 200, 0, "conv1", None, None, None),
        ("broken", 200, 1, "conv2", None, None, None),
        ("naive", 300, 0, "conv1", 0.74, 600_000_000, 12_001_000),
        ("naive", 300, 1, "conv2", 1.76, 1_200_000_000, 24_001_000),
        ("naive", 300, 2, "conv4", 0.5, None, None),
        ("naive", 300, 3, "conv3", None, 9, 7),
    }
    with Session(engine) as session:
        assert session.scalars(select(Run.prediction_agreement).order_by(Run.batch)).all() == [None, None, 0.9996]


def test_deleting_a_run_deletes_its_layer_times(engine):
    ingest_result(engine, make_result("naive", 100), None)
    ingest_result(engine, make_result("naive", 200), None)
    with _writer(engine).begin() as connection:
        connection.execute(delete(Run.__table__).where(Run.batch == 100))
    assert {row[1] for row in layer_rows(engine)} == {200}


@pytest.mark.parametrize("overrides, message", [
    ({"floors": [1]}, "floors: expected ['object', 'null'], got [1]"),
    ({"floors": {"conv1": 12}}, "floors.conv1: expected object, got 12"),
    ({"floors": {"conv1": {"bytes": 1, "flops": 1.5}}}, "floors.conv1.flops: expected ['integer', 'null'], got 1.5"),
    ({"floors": {"conv1": {"bytes": True, "flops": 1}}}, "floors.conv1.bytes: expected ['integer', 'null'], got true"),
    ({"timings": {"op_time_ms": [0.7, 1.2]}}, "timings.op_time_ms: expected ['object', 'null'], got [0.7, 1.2]"),
    ({"timings": {"op_time_ms": {"conv1": "fast"}}}, 'timings.op_time_ms.conv1: expected [\'number\', \'null\'], got "fast"'),
])
def test_bad_floors_and_op_times_are_refused(engine, overrides, message):
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, make_result(**overrides), "f.json")
    assert str(caught.value) == f"f.json: {message}"
    assert set(row_counts(engine).values()) == {0}


def test_variant_label():
    assert variant_label({"conv1": "naive", "conv2": "naive"}) == "naive"
    assert variant_label({"conv1": "naive", "conv2": "tiled"}) == "conv1=naive,conv2=tiled"


def test_shared_sweep_environment_and_builds_are_stored_once(engine):
    for batch in (100, 1000, 10000):
        assert ingest_result(engine, make_result("naive", batch), None).added == 1
    counts = row_counts(engine)
    assert (counts["run"], counts["sweep"], counts["environment"], counts["build"], counts["run_build"]) == (3, 1, 1, 1, 3)
    with Session(engine) as session:
        assert session.scalars(select(Build.variant)).all() == ["naive"]


def test_reingesting_the_same_files_changes_nothing(engine, tmp_path):
    paths = write_results(tmp_path / "runs", standard_results())
    first = ingest_files(engine, paths)
    assert (first.added, first.unchanged) == (6, 0)
    assert first.added_by_status == {"ok": 4, "incorrect": 1, "failed": 1}
    counts = row_counts(engine)
    assert counts["layer_time"] == 6 * 2
    second = ingest_files(engine, paths)
    assert (second.added, second.unchanged, second.errors) == (0, 6, [])
    assert row_counts(engine) == counts
    again = ingest_result(engine, read_result(paths[0]), None)
    assert (again.added, again.unchanged) == (0, 1)


def test_a_new_measurement_of_a_stored_job_is_a_new_row_and_the_latest_is_summarized(engine):
    """Re-measuring a job (its kernel edited, say) keeps both rows; latest_run and run_summary show
    the newer by started_at, whatever order they were ingested in."""
    old = make_result("naive", 100, op_time_ms=(0.9, 1.9), started_at="2026-11-22T18:40:00+00:00")
    new = make_result("naive", 100, op_time_ms=(0.5, 1.5), started_at="2026-11-23T09:00:00+00:00",
                      sources={"kernels/naive.cu": "f" * 64})
    assert old["run_key"] == new["run_key"] and old["measurement_id"] != new["measurement_id"]
    assert ingest_result(engine, new, None).added == ingest_result(engine, old, None).added == 1
    assert ingest_result(engine, new, None).unchanged == 1
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(Run.__table__)) == 2
        rows = connection.exec_driver_sql("SELECT op_time_1_ms, job_id FROM run_summary").all()
        assert rows == [(0.5, new["job_id"])]
        hashes = connection.exec_driver_sql("SELECT source_hash FROM run ORDER BY started_at").scalars().all()
        assert hashes[0] != hashes[1] and all(len(h) == 64 for h in hashes)
        latest = connection.exec_driver_sql("SELECT measurement_id FROM latest_run").scalars().all()
        assert latest == [new["measurement_id"]]


def test_each_run_records_where_it_was_measured_from(engine):
    ingest_result(engine, make_result("naive", 100), None)
    ingest_result(engine, as_format_1(make_result("tiled", 100)), None)
    with Session(engine) as session:
        new, old = session.scalars(select(Run).order_by(Run.variant)).all()
        assert (new.git_commit, new.git_dirty) == ("abc123" + "0" * 34, False)
        assert (new.sm_clock_mhz, new.memory_clock_mhz) == (1980, 2619)
        assert new.sources == {"kernels/naive.cu": make_result("naive")["sources"]["kernels/naive.cu"]}
        assert (new.environment.gpu_uuid, new.environment.driver) == ("GPU-5e1c2d6a-0000-4000-8000-000000000001",
                                                                       "580.95.05")
        # format 1 kept the commit in the environment, and had no clocks or sources
        assert (old.git_commit, old.git_dirty, old.sm_clock_mhz, old.source_hash) == ("abc123" + "0" * 34, None, None, None)
        assert old.measurement_id == old.run_key


def test_failed_and_incorrect_runs_keep_their_messages(engine):
    for result in standard_results():
        ingest_result(engine, result, None)
    with Session(engine) as session:
        bad = {r.variant: (r.status, r.error) for r in session.scalars(select(Run).where(Run.status != "ok"))}
    assert bad == {
        "fp16": ("incorrect", "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)"),
        "broken": ("failed", "compile failed: tiled.cu(12): error: identifier TILE undefined"),
    }


def test_failure_mid_ingest_leaves_no_row(engine, monkeypatch):
    result = make_result()
    result["samples"][2]["value"] = None  # the schema refuses it; past the schema, the database does
    monkeypatch.setattr("convsweep.store.ingest.check_result", lambda result, source, schema="result": None)
    with pytest.raises(StoreError, match=r"^cannot store results/bad\.json: .*") as caught:
        ingest_result(engine, result, "results/bad.json")
    assert "\n" not in str(caught.value)
    assert set(row_counts(engine).values()) == {0}
    assert ingest_result(engine, make_result(), None).added == 1


def test_concurrent_ingests_of_one_run_store_it_once(engine):
    result = make_result()
    barrier = threading.Barrier(4)
    outcomes = []

    def ingest():
        barrier.wait()
        outcomes.append(ingest_result(engine, result, None).added)

    threads = [threading.Thread(target=ingest) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [0, 0, 0, 1]
    assert row_counts(engine)["run"] == 1 and row_counts(engine)["sample"] == 9


def test_ingest_racing_an_uncommitted_insert_of_the_same_run(engine):
    # The other writer holds the run uncommitted: PostgreSQL makes our insert wait on the unique
    # index and then fail (handled as unchanged); SQLite makes our BEGIN IMMEDIATE wait.
    result = make_result()
    outcomes = []
    with Session(_writer(engine)) as other, other.begin():
        other.add(_run_row(other, ResultFile.from_json(result).measurements[0], None, "other"))
        other.flush()
        racer = threading.Thread(target=lambda: outcomes.append(ingest_result(engine, result, None).unchanged))
        racer.start()
        time.sleep(0.5)
        assert outcomes == []
    racer.join()
    assert outcomes == [1]
    assert row_counts(engine)["run"] == 1


def test_concurrent_ingests_of_runs_sharing_a_sweep(engine):
    results = [make_result("naive", batch) for batch in (1, 2, 3, 4, 5, 6)]
    _, errors = ingest_at_once(engine, results)
    assert errors == []
    counts = row_counts(engine)
    assert (counts["run"], counts["sweep"], counts["environment"], counts["build"]) == (6, 1, 1, 1)


def test_bad_files_are_reported_one_line_each_and_the_good_ones_stored(engine, tmp_path):
    good = write_results(tmp_path / "runs", standard_results()[:2])
    broken = tmp_path / "runs" / "broken-b100.json"
    broken.write_text('{"format": 2, "job_id": ', encoding="utf-8")
    no_key = make_result("tiled", 7)
    del no_key["measurement_id"]
    [no_key_path] = write_results(tmp_path / "other", [no_key])
    missing = tmp_path / "nothere.json"
    report = ingest_files(engine, [broken, good[0], missing, no_key_path, good[1]])
    assert (report.added, report.unchanged) == (2, 0)
    assert len(report.errors) == 3 and all("\n" not in e for e in report.errors)
    assert report.errors[0].startswith(f"{broken}: not valid JSON")
    assert report.errors[1].startswith(f"{missing}: cannot read")
    assert report.errors[2] == f"{no_key_path}: (top level): 'measurement_id' is a required property"
    assert row_counts(engine)["run"] == 2


@pytest.mark.parametrize("section, key", [("", "run_key"), ("spec", "batch"), ("sweep", "config_hash")])
def test_missing_key_names_file_and_key(engine, tmp_path, section, key):
    result = make_result()
    del (result[section] if section else result)[key]
    [path] = write_results(tmp_path / "runs", [result])
    assert ingest_files(engine, [path]).errors == [f"{path}: {section or '(top level)'}: '{key}' is a required property"]
    assert row_counts(engine)["run"] == 0


def test_started_at_with_z_suffix_and_bad_lists(engine):
    assert ingest_result(engine, make_result(started_at="2026-11-22T18:40:00Z"), None).added == 1
    with pytest.raises(StoreError, match=r"^d\.json: started_at: expected an ISO 8601 time, got 'yesterday'$"):
        ingest_result(engine, make_result(batch=7, started_at="yesterday"), "d.json")
    with pytest.raises(StoreError, match=r"^e\.json: samples\[0\]: expected object, got 1\.0$"):
        ingest_result(engine, make_result(batch=8, samples=[1.0]), "e.json")
    assert row_counts(engine)["run"] == 1


def test_wrong_format_and_status_are_refused(engine):
    with pytest.raises(StoreError, match=r"^a\.json: format: expected one of \[1, 2, 3, 'ncu-1', 'confirm-1', 'bench-2'\], "
                                        r"got 4$"):
        ingest_result(engine, make_result(format=4), "a.json")
    with pytest.raises(StoreError, match=r"^b\.json: status: expected one of \['ok', 'suspect', 'incorrect', 'failed', 'timeout'\], got \"great\"$"):
        ingest_result(engine, {**make_result(), "status": "great"}, "b.json")
    with pytest.raises(StoreError, match=r"^c\.json: \(top level\): expected object, got \[1, 2\]$"):
        ingest_result(engine, [1, 2], "c.json")
    with pytest.raises(StoreError, match=r'^d\.json: spec: expected object, got "xxx') as caught:
        ingest_result(engine, make_result(spec="x" * 5000), "d.json")
    assert len(str(caught.value)) < 120 and str(caught.value).endswith('x...')  # the value is cut, not the line
    assert row_counts(engine)["run"] == 0


def test_a_file_that_is_not_an_sqlite_database_is_named_as_such(tmp_path):
    path = tmp_path / "results.sqlite"
    path.write_bytes(b"this is a spreadsheet, not a database" * 100)
    with pytest.raises(StoreUnavailable) as caught:
        open_store(f"sqlite:///{path}")
    assert str(caught.value).startswith(f"{path} is not an SQLite database (file is not a database)")
    assert "unreachable" not in str(caught.value) and "\n" not in str(caught.value)
    assert path.read_bytes().startswith(b"this is a spreadsheet")  # left as it was


def test_a_schema_newer_than_the_code_is_refused(db_url):
    engine = open_store(db_url)
    with _writer(engine).begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0099'")
    engine.dispose()
    with pytest.raises(StoreUnavailable, match=r"has schema revision '0099', which this convsweep does not know "
                                               r"\(its newest is '\d+'\): a newer convsweep wrote it"):
        open_store(db_url)


def test_unreachable_postgresql_fails_fast_without_the_password():
    start_s = time.monotonic()
    with pytest.raises(StoreError) as caught:
        open_store("postgresql+psycopg://someone:s3cret@127.0.0.1:1/convsweep")
    message = str(caught.value)
    assert time.monotonic() - start_s < 6
    assert message.startswith("database postgresql+psycopg://someone:***@127.0.0.1:1/convsweep unreachable: ")
    assert "s3cret" not in message and "\n" not in message


def test_bad_urls_are_one_line_store_errors():
    with pytest.raises(StoreError, match=r"^bad database URL 'not a url'"):
        open_store("not a url")
    with pytest.raises(StoreError, match=r"^bad database URL nosuchdb://u:\*\*\*@h/x") as caught:
        open_store("nosuchdb://u:pw@h/x")
    assert "pw@" not in str(caught.value)


def test_the_result_schema_is_valid_and_lists_the_formats_ingest_takes_oldest_first():
    """record.FORMAT, what jobs write, is the newest of these: the list must end with it."""
    schema = load_schema("result")
    Draft202012Validator.check_schema(schema)
    formats = schema["properties"]["format"]["enum"]
    assert formats == sorted(formats) and FORMAT == formats[-1] == 3


def test_results_a_job_writes_are_stored(engine, tmp_path):
    """What convsweep/measure/job.py writes matches the schema: a CPU reference job, and one that failed
    (its dataset given as IDX files that are not there; the run keeps the dataset's name)."""
    spec = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "reference", "conv2": "reference"}, params={"conv1": {}, "conv2": {}},
                batch=8, streams=1, host_memory="pageable", repeats=1, warmup=0, profiler="events")
    sweep = {"experiment": "t", "config_hash": "h", "config_path": "x.yaml"}
    missing = {"name": "fashion", "images": str(tmp_path / "no-images.gz"), "labels": str(tmp_path / "no-labels.gz")}
    ok = run_job(JobSpec.for_run(RunSpec(**spec), sweep), tmp_path / "ok.json")
    run_job(JobSpec.for_run(RunSpec(**{**spec, "dataset": missing}), sweep), tmp_path / "failed.json")
    report = ingest_files(engine, [tmp_path / "ok.json", tmp_path / "failed.json"])
    assert (report.added, report.errors, report.added_by_status) == (2, [], {"ok": 1, "failed": 1})
    with Session(engine) as session:
        runs = {run.status: run for run in session.scalars(select(Run))}
        assert (runs["ok"].dataset, runs["failed"].dataset) == ("mnist5k", "fashion")
        assert (runs["ok"].job_key, runs["ok"].grid["index"]) == (ok.job_key, 0)
        assert [(t.layer_index, t.layer) for t in runs["ok"].layer_times] == [(0, "conv1"), (1, "conv2")]
        assert all(t.op_time_ms > 0 for t in runs["ok"].layer_times)


def test_result_file_round_trip_keeps_path(engine, tmp_path):
    [path] = write_results(tmp_path / "runs", [make_result()])
    ingest_files(engine, [path])
    with Session(engine) as session:
        assert session.scalars(select(Run.result_path)).one() == str(path)
    assert json.loads(Path(path).read_text())["run_key"]


# --- format 3: a job file, one measurement per setting ----------------------------------------


def stored_settings(engine: Engine) -> list[tuple[Any, ...]]:
    """(grid index, status, job_key, grid, [(layer, params, op_time_ms)]) of every run, by grid index."""
    with Session(engine) as session:
        return [(run.grid["index"] if run.grid else None, run.status, run.job_key, run.grid,
                 [(t.layer, t.params, t.op_time_ms) for t in run.layer_times])
                for run in sorted(session.scalars(select(Run)), key=lambda r: (r.grid or {}).get("index", -1))]


def test_a_job_file_stores_one_run_per_setting(engine, tmp_path):
    job_file = make_job_file(search={"strategy": "random", "max_settings": 3, "seed": 7}, valid=5)
    [path] = write_results(tmp_path / "runs", [job_file])
    report = ingest_files(engine, [path])
    assert (report.added, report.unchanged, report.errors) == (3, 0, [])
    assert report.added_by_status == {"ok": 1, "incorrect": 1, "failed": 1}
    counts = row_counts(engine)
    assert (counts["run"], counts["layer_time"], counts["sweep"], counts["environment"]) == (3, 6, 1, 1)
    assert counts["build"] == 2  # the failed setting never compiled; each other setting is a build of its own
    grid = {"job_key": job_file["job_key"], "settings": 3, "valid": 5,
            "search": {"strategy": "random", "max_settings": 3, "seed": 7}}
    assert stored_settings(engine) == [
        (0, "ok", job_file["job_key"], {**grid, "index": 0}, [("conv1", {"BLOCK": 64}, 0.5), ("conv2", {"BLOCK": 64}, 0.9)]),
        (1, "incorrect", job_file["job_key"], {**grid, "index": 1},
         [("conv1", {"BLOCK": 128}, 0.1), ("conv2", {"BLOCK": 128}, 0.2)]),
        (2, "failed", job_file["job_key"], {**grid, "index": 2},
         [("conv1", {"BLOCK": 256}, None), ("conv2", {"BLOCK": 256}, None)]),
    ]
    with Session(engine) as session:
        runs = session.scalars(select(Run).order_by(Run.id)).all()
        # Each setting keeps its own identity, outcome and times; all name the job's file
        assert [r.run_key for r in runs] == [m["run_key"] for m in job_file["measurements"]]
        assert len(set(r.run_key for r in runs)) == 3
        assert {r.job_id for r in runs} == {job_file["job_id"]} and {r.result_path for r in runs} == {str(path)}
        assert [r.params for r in runs] == [every_layer(BLOCK=block) for block in (64, 128, 256)]
        assert [len(r.samples) for r in runs] == [9, 9, 0]
        assert runs[1].error == "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)"
    with engine.connect() as connection:
        # The new JSON columns hold SQL NULL for a format 2 run, not JSON's 'null'
        ingest_result(engine, make_result("tiled", 100), None)
        nulls = connection.exec_driver_sql(
            "SELECT COUNT(*) FROM run WHERE job_key IS NULL AND grid IS NULL AND variant = 'tiled'").scalar()
        assert nulls == 1
        assert connection.exec_driver_sql("SELECT COUNT(*) FROM latest_run WHERE job_key IS NOT NULL").scalar() == 3


def test_ingesting_a_job_file_twice_changes_nothing(engine, tmp_path):
    paths = write_results(tmp_path / "runs", [make_job_file(), make_job_file(tuning_results(batch=1000))])
    first = ingest_files(engine, paths)
    assert (first.added, first.unchanged) == (6, 0)
    counts = row_counts(engine)
    second = ingest_files(engine, paths)
    assert (second.added, second.unchanged, second.errors, second.added_by_status) == (0, 6, [], {})
    assert row_counts(engine) == counts


def test_a_job_file_whose_measurements_are_partly_stored_adds_only_the_rest(engine):
    """A job resumed after an interruption rewrites its file with the settings it had measured
    (same measurement ids) and those it measured since."""
    measurements = tuning_results() + [make_result("naive", 100, params=every_layer(BLOCK=512), op_time_ms=(0.4, 0.8))]
    resumed = make_job_file(measurements, settings={"valid": 4, "measured": 2, "resumed": 2})
    interrupted = {**resumed, "measurements": resumed["measurements"][:2],
                   "settings": {"valid": 4, "measured": 2, "resumed": 0}}
    assert ingest_result(engine, interrupted, "a.json").added == 2
    report = ingest_result(engine, resumed, "a.json")
    assert (report.added, report.unchanged, report.added_by_status) == (2, 2, {"failed": 1, "ok": 1})
    assert [row[:2] for row in stored_settings(engine)] == [(0, "ok"), (1, "incorrect"), (2, "failed"), (3, "ok")]
    assert row_counts(engine)["layer_time"] == 8


@pytest.mark.parametrize("index, section, key, value, message", [
    (3, None, "status", "great", "measurements[3].status: expected one of ['ok', 'suspect', 'incorrect', 'failed', 'timeout'], got \"great\""),
    (1, "spec", "batch", 0, "measurements[1].spec.batch: expected at least 1, got 0"),
    (2, "timings", "op_time_ms", {"conv1": "fast"},
     "measurements[2].timings.op_time_ms.conv1: expected ['number', 'null'], got \"fast\""),
    (0, "grid", "index", -1, "measurements[0].grid.index: expected at least 0, got -1"),
    (3, None, "grid", None, "measurements[3]: 'grid' is a required property"),
    (1, None, "measurement_id", None, "measurements[1]: 'measurement_id' is a required property"),
    (2, None, "started_at", "yesterday", "measurements[2].started_at: expected an ISO 8601 time, got 'yesterday'"),
])
def test_a_job_file_with_one_bad_measurement_stores_nothing(engine, tmp_path, index, section, key, value, message):
    """Checked by the schema, or (started_at) only while the earlier settings are being stored."""
    job_file = make_job_file(tuning_results() + [make_result("naive", 100, params=every_layer(BLOCK=512))])
    target = job_file["measurements"][index]
    target = target[section] if section else target
    if value is None:
        del target[key]
    else:
        target[key] = value
    [path] = write_results(tmp_path / "runs", [job_file])
    report = ingest_files(engine, [path])
    assert (report.added, report.unchanged, report.errors) == (0, 0, [f"{path}: {message}"])
    assert set(row_counts(engine).values()) == {0}


@pytest.mark.parametrize("change, message", [
    (lambda f: f["measurements"][2].update(measurement_id=f["measurements"][0]["measurement_id"]),
     "measurements[2].measurement_id: '{id}' is measurements[0]'s too"),
    (lambda f: f["measurements"][1]["grid"].update(job_key="other"),
     "measurements[1].grid.job_key: expected the file's job_key '{job_key}', got 'other'"),
    (lambda f: f.update(measurements=[]), "measurements: must not be empty"),
    (lambda f: f["job"]["search"].update(strategy="random"), "job.search: 'seed' is a required property"),
    (lambda f: f.pop("job_key"), "(top level): 'job_key' is a required property"),
    (lambda f: f.update(format=5), "format: expected one of [1, 2, 3, 'ncu-1', 'confirm-1', 'bench-2'], got 5"),
])
def test_a_job_file_that_does_not_hold_together_is_refused(engine, change, message):
    job_file = make_job_file()
    expected = message.format(id=job_file["measurements"][0]["measurement_id"], job_key=job_file["job_key"])
    change(job_file)
    with pytest.raises(StoreError) as caught:
        ingest_result(engine, job_file, "j.json")
    assert str(caught.value) == f"j.json: {expected}"
    assert row_counts(engine)["run"] == 0


def test_storing_tells_a_database_that_went_away_from_a_file_it_refused():
    """Results and profiles both: the first kind leaves the file for later, the second names it."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    from convsweep.store.engine import storing

    with pytest.raises(StoreUnavailable, match=r"^cannot store r\.json: server closed the connection$"):
        with storing("r.json"):
            raise OperationalError("INSERT", {}, Exception("server closed\n the connection"))
    with pytest.raises(StoreError, match=r"^cannot store p\.json: value too long$") as refused:
        with storing("p.json"):
            raise DBAPIError("INSERT", {}, Exception("value too long"))
    assert not isinstance(refused.value, StoreUnavailable)


def test_a_database_failure_in_the_last_setting_stores_none_of_them(engine, monkeypatch):
    job_file = make_job_file()
    job_file["measurements"][-1]["samples"] = [{"metric": "op_time_ms", "layer": "conv1", "repeat": 0, "value": None}]
    monkeypatch.setattr("convsweep.store.ingest.check_result", lambda result, source, schema="result": None)
    with pytest.raises(StoreError, match=r"^cannot store j\.json: ") as caught:
        ingest_result(engine, job_file, "j.json")
    assert "\n" not in str(caught.value)
    assert set(row_counts(engine).values()) == {0}


def test_concurrent_ingests_of_overlapping_job_files_store_each_setting_once(engine):
    """Two files sharing a measurement, ingested at once: one stores it, the other (PostgreSQL: its
    insert fails on the unique index, and it tries again) skips it and stores the rest."""
    measurements = tuning_results() + [make_result("naive", 100, params=every_layer(BLOCK=512))]
    files = [make_job_file(measurements[:3]), make_job_file(measurements[1:])]
    for _ in range(3):
        files.append(make_job_file(measurements))
    reports, errors = ingest_at_once(engine, files)
    assert errors == []
    assert sum(r.added for r in reports) == 4
    assert sum(r.added + r.unchanged for r in reports) == 3 + 3 + 3 * 4
    assert row_counts(engine)["run"] == 4 and row_counts(engine)["layer_time"] == 8


def test_job_files_and_single_measurements_count_together(engine, tmp_path):
    paths = write_results(tmp_path / "runs", [make_job_file(), *standard_results()[:2]])
    report = ingest_files(engine, paths)
    assert (report.added, report.unchanged, report.added_by_status) == (5, 0, {"ok": 3, "incorrect": 1, "failed": 1})


# --- migrations ---------------------------------------------------------------------------


def layer_rows(engine: Engine) -> set[tuple[Any, ...]]:
    """Every layer_time row as (variant, batch, layer_index, layer, op_time_ms, flops, bytes)."""
    with engine.connect() as connection:
        return {tuple(row) for row in connection.execute(
            select(Run.variant, Run.batch, LayerTime.layer_index, LayerTime.layer, LayerTime.op_time_ms,
                   LayerTime.flops, LayerTime.bytes)
            .join(Run, Run.id == LayerTime.run_id))}


def expected_layer_rows(results: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    rows = set()
    for result in results:
        op_time_ms = result["timings"]["op_time_ms"] or {}
        for index, layer in enumerate(result["spec"]["variants"]):
            floor = result["floors"].get(layer, {})
            rows.add((variant_label(result["spec"]["variants"]), result["spec"]["batch"], index, layer,
                      op_time_ms.get(layer), floor.get("flops"), floor.get("bytes")))
    return rows


def engine_at(db_url: str, revision: str) -> Engine:
    """An engine on the database, migrated to one revision (not to head, as open_store does)."""
    url = resolve_url(db_url)
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(url)
    with _writer(engine).begin() as connection:
        command.upgrade(alembic_config(connection), revision)
    return engine


def insert_the_old_way(connection: Connection, result: dict[str, Any]) -> None:
    """Store a result the way a 0001 to 0004 database held it (up to 0003 op times in run's
    columns; from 0002 layer_time rows, from 0004 with their position): the tables as they are
    there, no models."""
    tables = MetaData()
    tables.reflect(connection, only=["sweep", "environment", "run", "sample"])
    sweep, environment, run, sample = (tables.tables[t] for t in ("sweep", "environment", "run", "sample"))
    spec, now = result["spec"], datetime.now(timezone.utc)
    keys = {"experiment": result["sweep"]["experiment"], "config_hash": result["sweep"]["config_hash"]}
    sweep_id = connection.scalar(select(sweep.c.id).filter_by(**keys))
    if sweep_id is None:
        sweep_id = connection.scalar(insert(sweep).values(**keys, created_at=now).returning(sweep.c.id))
    env_hash = canonical_hash(result["environment"])
    environment_id = connection.scalar(select(environment.c.id).filter_by(env_hash=env_hash))
    if environment_id is None:
        environment_id = connection.scalar(
            insert(environment).values(env_hash=env_hash, gpu=result["environment"]["gpu"]).returning(environment.c.id))
    op_time_ms = result["timings"]["op_time_ms"]
    layers = list(spec["variants"])
    values = dict(
        run_key=result["run_key"], job_id=result["job_id"], sweep_id=sweep_id, environment_id=environment_id,
        experiment=spec["experiment"], network=spec["network"], dataset=spec["dataset"],
        variants=spec["variants"], params=spec["params"], variant=variant_label(spec["variants"]),
        batch=spec["batch"], streams=spec["streams"], host_memory=spec["host_memory"],
        status=result["status"], accuracy=result["accuracy"],
        op_time_1_ms=(op_time_ms or {}).get(layers[0]), op_time_2_ms=(op_time_ms or {}).get(layers[1]),
        op_time_ms=op_time_ms, forward_ms=result["timings"]["forward_ms"], floors=result["floors"],
        ingested_at=now, measurement_id=result["measurement_id"], started_at=datetime.fromisoformat(result["started_at"]))
    run_id = connection.scalar(insert(run).values(**{k: v for k, v in values.items() if k in run.c}).returning(run.c.id))
    for s in result["samples"]:
        connection.execute(insert(sample).values(run_id=run_id, metric=s["metric"], layer=s["layer"],
                                                 repeat=s["repeat"], value=s["value"]))
    if "layer_time" in inspect(connection).get_table_names():
        layer_time = Table("layer_time", MetaData(), autoload_with=connection)
        floors = result["floors"] or {}
        for index, layer in enumerate([*layers, *(name for name in floors if name not in layers)]):
            row = dict(run_id=run_id, layer=layer, layer_index=index, variant=spec["variants"].get(layer),
                       op_time_ms=(op_time_ms or {}).get(layer), flops=floors.get(layer, {}).get("flops"),
                       bytes=floors.get(layer, {}).get("bytes"))
            connection.execute(insert(layer_time).values(**{k: v for k, v in row.items() if k in layer_time.c}))


def stored_the_old_way(db_url: str, revision: str, results: list[dict]) -> dict[str, int]:
    """A database at `revision` holding `results` as that revision's code stored them; its row counts."""
    old = engine_at(db_url, revision)
    try:
        with _writer(old).begin() as connection:
            for result in results:
                insert_the_old_way(connection, result)
        return row_counts(old)
    finally:
        old.dispose()


def test_migrating_a_0001_database_backfills_layer_time(db_url):
    results = standard_results() + [make_result("naive", 10, status="failed", floors={})]
    old = engine_at(db_url, "0001")
    with _writer(old).begin() as connection:
        assert "layer_time" not in inspect(connection).get_table_names()
        for result in results:
            insert_the_old_way(connection, result)
    old.dispose()

    engine = open_store(db_url)
    try:
        assert layer_rows(engine) == expected_layer_rows(results)
        assert row_counts(engine)["layer_time"] == 7 * 2
        # 0003 rebuilds the run table: its children survive (foreign keys are off while it does)
        assert row_counts(engine)["sample"] == sum(len(result["samples"]) for result in results) > 0
        with engine.connect() as connection:
            # The same schema as a database created at head
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
            # The database never held it: old runs have no prediction agreement
            assert set(connection.scalars(select(Run.prediction_agreement))) == {None}
            assert connection.scalar(select(func.count()).select_from(Run.__table__)) == 7
        # Ingest stays idempotent over migrated runs (their files are format 1), and new runs get
        # their rows as usual
        assert [ingest_result(engine, as_format_1(result), None).unchanged for result in results] == [1] * 7
        assert ingest_result(engine, make_result("tiled", 5000), None).added == 1
        assert layer_rows(engine) == expected_layer_rows(results + [make_result("tiled", 5000)])
        assert [c["name"] for c in inspect(engine).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
        assert json.loads(run_summary_agreements(engine)) == {"tiled-5000": 0.9996}
    finally:
        engine.dispose()
    # Opening it again migrates nothing and backfills nothing twice
    again = open_store(db_url)
    assert row_counts(again)["layer_time"] == 8 * 2
    again.dispose()


def run_summary_agreements(engine: Engine) -> str:
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT variant, batch, prediction_agreement FROM run_summary WHERE prediction_agreement IS NOT NULL")
        return json.dumps({f"{variant}-{batch}": agreement for variant, batch, agreement in rows})


def test_downgrade_to_0001_keeps_the_runs_and_upgrading_again_restores_layer_time(engine):
    for result in standard_results():
        ingest_result(engine, result, None)
    before = row_counts(engine)
    ingested = layer_rows(engine)
    assert ingested == expected_layer_rows(standard_results())
    migrate(engine, "0001", downgrade=True)
    with engine.connect() as connection:
        schema = inspect(connection)
        assert "layer_time" not in schema.get_table_names()
        assert "prediction_agreement" not in {c["name"] for c in schema.get_columns("run")}
        assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0001_COLUMNS
        # Nothing cascaded away with the dropped column
        for table in ("run", "sample", "kernel", "memcpy", "run_build"):
            assert connection.scalar(select(func.count()).select_from(Base.metadata.tables[table])) == before[table]
    migrate(engine, "head")
    assert layer_rows(engine) == ingested
    assert row_counts(engine) == before


def op_times_by_run(engine: Engine, view: str) -> dict[int, tuple[float | None, float | None]]:
    """run id -> (op_time_1_ms, op_time_2_ms), as a table or view shows them."""
    run_id = "id" if view == "run" else "run_id"
    with engine.connect() as connection:
        return {row[0]: tuple(row[1:]) for row in connection.exec_driver_sql(
            f"SELECT {run_id}, op_time_1_ms, op_time_2_ms FROM {view}")}


def report_text(db_url: str, tmp_path: Path) -> str:
    """What `convsweep report` writes for the standard results' experiment."""
    out = tmp_path / "report.md"
    assert cli_main(["report", "--db", db_url, "--experiment", "lenet86-baseline", "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def seeds_table(db_url: str) -> str:
    """The summary query's medians as run_summary has shown them since 0003 (0006 added their spreads)."""
    return run_query(as_reader(db_url), "SELECT variant, batch, streams, op_time_1_ms, op_time_2_ms, forward_ms, total_s, accuracy "
                             "FROM run_summary WHERE status = 'ok' "
                             "ORDER BY experiment, variant, batch, streams, host_memory, run_id")


def test_migrating_a_0003_database_moves_op_times_into_layer_time_and_back(db_url, tmp_path):
    older = make_result("naive", 100, op_time_ms=(0.9, 1.9), started_at="2026-11-21T10:00:00+00:00")
    lost, columns_only = make_result("tiled", 10, op_time_ms=(0.3, 0.6)), make_result("naive", 20, op_time_ms=(0.4, 0.8))
    results = standard_results() + [older, lost, columns_only]
    old = engine_at(db_url, "0003")
    with _writer(old).begin() as connection:
        for result in results:
            insert_the_old_way(connection, result)
        # Two runs whose layer_time differs from their columns: rows lost, and times only the columns hold
        connection.exec_driver_sql("DELETE FROM layer_time WHERE run_id IN (SELECT id FROM run WHERE batch = 10)")
        connection.exec_driver_sql("UPDATE layer_time SET op_time_ms = NULL "
                                   "WHERE run_id IN (SELECT id FROM run WHERE batch = 20)")
        connection.exec_driver_sql("UPDATE run SET op_time_ms = NULL WHERE batch = 20")
    columns, summary = op_times_by_run(old, "run"), op_times_by_run(old, "run_summary")
    old.dispose()
    assert columns[1] == (0.082, 0.191) and len(summary) == len(results) - 1  # the older measurement is not latest
    seeds = seeds_table(db_url)  # `convsweep report` shows 0006's spreads: compared after migrating

    engine = open_store(db_url)
    try:
        # The same op time 1 and 2 for every measurement, now computed from layer_time
        assert op_times_by_run(engine, "run_op_time") == columns
        assert op_times_by_run(engine, "run_summary") == summary
        history = json.loads(run_query(as_reader(db_url), "history", fmt="json"))
        assert {r["run_id"]: (r["op time 1 (ms)"], r["op time 2 (ms)"]) for r in history} == columns
        assert seeds_table(db_url) == seeds and "op time 1 ±%" in report_text(db_url, tmp_path)
        migrated = layer_rows(engine)
        assert migrated == expected_layer_rows(results)  # positions from spec.variants; lost rows rebuilt
        assert row_counts(engine)["sample"] == sum(len(result["samples"]) for result in results) > 0
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert not {"op_time_1_ms", "op_time_2_ms", "op_time_ms"} & {c["name"] for c in inspect(connection).get_columns("run")}

        migrate(engine, "0003", downgrade=True)
        assert op_times_by_run(engine, "run") == columns
        assert op_times_by_run(engine, "run_summary") == summary
        with engine.connect() as connection:
            assert "layer_index" not in {c["name"] for c in inspect(connection).get_columns("layer_time")}
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_0003_COLUMNS
            run = Table("run", MetaData(), autoload_with=connection)
            restored = dict(connection.execute(select(run.c.batch, run.c.op_time_ms).where(run.c.variant == "naive")).all())
        assert restored[1000] == {"conv1": 0.74, "conv2": 1.76} and restored[20] == {"conv1": 0.4, "conv2": 0.8}
        assert seeds_table(db_url) == seeds

        migrate(engine, "head")
        assert layer_rows(engine) == migrated
        assert op_times_by_run(engine, "run_op_time") == columns
    finally:
        engine.dispose()


def layer_params(engine: Engine) -> dict[tuple[str, str], Any]:
    """(measurement id, layer) -> that layer_time row's params."""
    with engine.connect() as connection:
        return {(key, layer): params for key, layer, params in connection.execute(
            select(Run.measurement_id, LayerTime.layer, LayerTime.params).join(Run, Run.id == LayerTime.run_id))}


def expected_layer_params(results: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """What layer_params should hold: each layer's entry of spec.params, null where there is none."""
    expected = {}
    for result in results:
        params = result["spec"]["params"] or {}
        for layer in [*result["spec"]["variants"], *result["floors"]]:
            expected[(result["measurement_id"], layer)] = params.get(layer)
    return expected


def test_migrating_a_0004_database_gives_each_layer_its_tunables_and_back(db_url, tmp_path):
    no_params = make_result("tiled", 10)
    no_params["spec"]["params"] = None  # written as JSON's null
    partial = make_result("naive", 20, params={"conv1": {"BLOCK": 32}})
    partial["floors"]["conv3"] = {"bytes": 7, "flops": 9}  # a layer spec.params does not name
    results = standard_results() + tuning_results(batch=1000) + [no_params, partial]
    before = stored_the_old_way(db_url, "0004", results)
    summary = seeds_table(db_url)

    engine = open_store(db_url)
    try:
        migrated = layer_params(engine)
        assert migrated == expected_layer_params(results)
        assert migrated[(partial["measurement_id"], "conv1")] == {"BLOCK": 32}
        assert migrated[(results[-3]["measurement_id"], "conv2")] == {"BLOCK": 256}
        assert row_counts(engine) == before
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM run WHERE job_key IS NULL AND grid IS NULL").scalar() \
                == len(results)
            # Only the layer rows without tunables are SQL NULL
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM layer_time WHERE params IS NULL").scalar() == 3
        assert seeds_table(db_url) == summary
        tuning = json.loads(run_query(as_reader(db_url), "tuning", fmt="json"))
        assert len(tuning) == row_counts(engine)["layer_time"]
        # Format 3 files ingest beside the migrated runs
        assert ingest_result(engine, make_job_file(tuning_results(batch=5000)), None).added == 3

        migrate(engine, "0004", downgrade=True)
        with engine.connect() as connection:
            schema = inspect(connection)
            assert not {"job_key", "grid"} & {c["name"] for c in schema.get_columns("run")}
            assert "params" not in {c["name"] for c in schema.get_columns("layer_time")}
            assert "job_key" not in connection.exec_driver_sql("SELECT * FROM latest_run WHERE 1 = 0").keys()
            assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0003_COLUMNS
        assert row_counts(engine)["run"] == before["run"] + 3
        assert json.loads(run_query(as_reader(db_url), "SELECT COUNT(*) AS n FROM run_summary", fmt="json")) == [{"n": len(results) + 3}]

        # Upgrading again gives every layer its tunables back; the downgrade lost job_key and grid
        migrate(engine, "head")
        again = layer_params(engine)
        assert {key: again[key] for key in migrated} == migrated and len(again) == len(migrated) + 6
        with engine.connect() as connection:
            restored = connection.execute(select(LayerTime.params).join(Run, Run.id == LayerTime.run_id)
                                          .where(Run.batch == 5000, LayerTime.layer == "conv2")).scalars().all()
            assert sorted(params["BLOCK"] for params in restored) == [64, 128, 256]
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM run WHERE job_key IS NOT NULL").scalar() == 0
    finally:
        engine.dispose()


def spreads(engine: Engine) -> dict[tuple[str, str | None], float | None]:
    """(measurement id, layer) -> that layer_time row's op_time_spread, and (measurement id, None) ->
    its run's forward_spread."""
    with engine.connect() as connection:
        found = {(key, layer): spread for key, layer, spread in connection.execute(
            select(Run.measurement_id, LayerTime.layer, LayerTime.op_time_spread).join(Run, Run.id == LayerTime.run_id))}
        found.update({(key, None): spread for key, spread in connection.execute(
            select(Run.measurement_id, Run.forward_spread))})
    return found


def expected_spreads(results: list[dict[str, Any]]) -> dict[tuple[str, str | None], Any]:
    """What spreads should hold for make_result's samples: op time t sampled as t, t + 0.001 and
    t + 0.002 (spread 0.001 / (t + 0.001)), forward as 42.1, 43.1 and 44.1 (1 / 43.1); failed runs
    have no samples, so no spreads."""
    expected: dict[tuple[str, str | None], Any] = {}
    for result in results:
        op_time_ms = result["timings"]["op_time_ms"] or {}
        for layer in result["spec"]["variants"]:
            expected[(result["measurement_id"], layer)] = 0.001 / (op_time_ms[layer] + 0.001) if op_time_ms else None
        expected[(result["measurement_id"], None)] = 1 / 43.1 if op_time_ms else None
    return expected


def test_migrating_a_0005_database_backfills_each_spread_from_the_samples_and_back(db_url):
    results = standard_results() + tuning_results(batch=1000)
    before = stored_the_old_way(db_url, "0005", results)
    medians, history = seeds_table(db_url), run_query(as_reader(db_url), "history", fmt="json")

    engine = open_store(db_url)
    try:
        migrated = spreads(engine)
        assert migrated == pytest.approx(expected_spreads(results))
        assert row_counts(engine) == before
        with engine.connect() as connection:  # every earlier run had a fixed count: the timed ones say so
            reasons = connection.exec_driver_sql(
                "SELECT r.stop_reason, EXISTS (SELECT 1 FROM sample s WHERE s.run_id = r.id) FROM run r").all()
            assert {(reason, bool(timed)) for reason, timed in reasons} == {("fixed", True), (None, False)}
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
        # The medians and the history read as before; the summary shows each spread beside its median
        assert seeds_table(db_url) == medians and run_query(as_reader(db_url), "history", fmt="json") == history
        naive_100 = json.loads(run_query(as_reader(db_url), "summary", fmt="json"))[0]
        assert (naive_100["variant"], naive_100["batch"]) == ("naive", 100)
        assert [naive_100[f"{name} ±%"] for name in ("op time 1", "op time 2", "forward")] == ["1.2", "0.5", "2.3"]
        # Runs ingested at 0006 get their spreads from ingest
        assert ingest_result(engine, make_job_file(tuning_results(batch=5000)), None).added == 3
        ingested = spreads(engine)
        assert len(ingested) == len(migrated) + 3 * 3

        migrate(engine, "0005", downgrade=True)
        with engine.connect() as connection:
            schema = inspect(connection)
            run_columns = [c["name"] for c in schema.get_columns("run")]
            assert "forward_spread" not in run_columns and "stop_reason" not in run_columns
            assert "op_time_spread" not in {c["name"] for c in schema.get_columns("layer_time")}
            assert [c["name"] for c in schema.get_columns("run_op_time")] == ["run_id", "op_time_1_ms", "op_time_2_ms"]
            assert list(connection.exec_driver_sql("SELECT * FROM latest_run WHERE 1 = 0").keys()) \
                == run_columns + LATEST_RUN_0004_OWN_COLUMNS
            assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0003_COLUMNS
        # The samples stay (nine per timed setting, none for the failed one); history reads 0005's run_op_time
        assert row_counts(engine)["sample"] == before["sample"] + 2 * 9
        assert len(json.loads(run_query(as_reader(db_url), "history", fmt="json"))) == len(results) + 3

        # Upgrading again computes every spread from the samples the downgrade kept
        migrate(engine, "head")
        assert spreads(engine) == ingested
    finally:
        engine.dispose()


def with_cache(result: dict[str, Any], cache: str) -> dict[str, Any]:
    """The result as a measurement of the same setting with a cold (or warm) L2: another run_key."""
    result["spec"]["cache"] = cache
    result["run_key"] = canonical_hash(result["spec"])
    return result


def measured_under(cache: str = "warm", **overrides: Any) -> dict[str, Any]:
    """A format 3 file of one cold or warm setting whose NVML readings say: clocks 1980 -> 1755 MHz,
    12.5 J over 5 passes, passes 3 and 4 held down by the power cap."""
    result = with_cache(make_result("naive", 100, **overrides), cache)
    result.update(clocks_after={"sm_mhz": 1755, "memory_mhz": 2619},
                  energy={"joules": 12.5, "passes": 5, "joules_per_pass": 2.5},
                  throttle={"reasons": ["sw_power_cap"], "repeats": [3, 4]},
                  note="2 of 5 timed passes ran with the clocks held down (sw_power_cap)")
    for repeat in (3, 4):
        result["samples"].append({"metric": "forward_ms", "layer": None, "repeat": repeat, "value": 50.0})
    return make_job_file([result])


def test_cache_clocks_energy_and_throttled_samples_are_stored(engine, db_url):
    assert ingest_result(engine, measured_under("cold"), None).added == 1
    assert ingest_result(engine, make_job_file([make_result("naive", 100)]), None).added == 1
    with Session(engine) as session:
        cold, warm = session.scalars(select(Run).order_by(Run.id)).all()
        assert (cold.cache, warm.cache) == ("cold", "warm")
        assert (cold.sm_clock_mhz, cold.sm_clock_after_mhz, cold.memory_clock_after_mhz) == (1980, 1755, 2619)
        assert (cold.energy_j, cold.energy_per_pass_j) == (12.5, 2.5)
        assert (cold.throttle_reasons, cold.throttled_passes) == ("sw_power_cap", 2)
        assert cold.note.startswith("2 of 5 timed passes")
        # A format 2 file knows none of it: nulls, never zeros
        assert (warm.energy_j, warm.throttled_passes, warm.sm_clock_after_mhz, warm.note) == (None, None, None, None)
        flags = session.execute(select(Sample.run_id, Sample.repeat, Sample.throttled)).all()
        assert {(repeat, throttled) for run_id, repeat, throttled in flags if run_id == cold.id} == \
            {(0, False), (1, False), (2, False), (3, True), (4, True)}
        assert {throttled for run_id, _, throttled in flags if run_id == warm.id} == {None}
    assert sorted(row["cache"] for row in json.loads(run_query(as_reader(db_url), "summary", fmt="json"))) == ["cold", "warm"]
    energy = json.loads(run_query(as_reader(db_url), "energy", fmt="json"))
    cold_row = next(row for row in energy if row["cache"] == "cold")
    flops = sum(f["flops"] for f in make_result("naive", 100)["floors"].values())
    assert cold_row["J/pass"] == 2.5 and cold_row["throttled"] == 2 and cold_row["reasons"] == "sw_power_cap"
    assert cold_row["conv GFLOP/J"] == pytest.approx(flops / 2.5e9)
    assert (cold_row["sm MHz before"], cold_row["sm MHz after"]) == (1980, 1755)


def test_query_cache_pairs_the_cold_and_warm_runs_of_a_job(db_url, engine):
    ingest_result(engine, make_job_file([make_result("naive", 100, op_time_ms=(0.08, 0.19))]), None)
    cold = with_cache(make_result("naive", 100, op_time_ms=(0.12, 0.38)), "cold")
    ingest_result(engine, make_job_file([cold]), None)
    ingest_result(engine, make_job_file([make_result("tiled", 100)]), None)  # warm only: no pair
    rows = json.loads(run_query(as_reader(db_url), "cache", fmt="json"))
    assert [(r["variant"], r["layer"]) for r in rows] == [("naive", "conv1"), ("naive", "conv2")]
    assert [r["cold / warm"] for r in rows] == pytest.approx([0.12 / 0.08, 0.38 / 0.19])


def test_migrating_a_0006_database_calls_its_runs_warm_and_back(db_url):
    results = standard_results()
    before = stored_the_old_way(db_url, "0006", results)
    engine = open_store(db_url)
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT DISTINCT cache FROM run").scalars().all() == ["warm"]
            assert connection.exec_driver_sql(
                "SELECT COUNT(*) FROM run WHERE energy_j IS NOT NULL OR note IS NOT NULL").scalar() == 0
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
        assert row_counts(engine) == before
        migrate(engine, "0006", downgrade=True)
        with engine.connect() as connection:
            schema = inspect(connection)
            assert "cache" not in {c["name"] for c in schema.get_columns("run")}
            assert "throttled" not in {c["name"] for c in schema.get_columns("sample")}
            assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0006_COLUMNS
            assert_latest_run_shows_every_run_column(connection)
        assert row_counts(engine) == before
    finally:
        engine.dispose()


def test_ingest_and_migration_0011_store_each_runs_fastest_pass(db_url):
    """forward_min_ms: the fastest forward sample of a run, from the record at ingest, and filled
    from the stored samples for runs of a database made before it."""
    results = standard_results()
    before = stored_the_old_way(db_url, "0010", results)
    engine = open_store(db_url)
    try:
        new = make_result("tiled", 5000)
        ingest_result(engine, new, None)
        with engine.connect() as connection:
            fastest = dict(connection.execute(select(Run.measurement_id, Run.forward_min_ms)).all())
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
        for result in [*results, new]:
            forward = [s["value"] for s in result["samples"] if s["metric"] == "forward_ms" and s.get("layer") is None]
            assert fastest[result["measurement_id"]] == (pytest.approx(min(forward)) if forward else None)
        assert any(value is not None for value in fastest.values())
        migrate(engine, "0010", downgrade=True)
        with engine.connect() as connection:
            assert "forward_min_ms" not in {c["name"] for c in inspect(connection).get_columns("run")}
            assert_latest_run_shows_every_run_column(connection)
        assert row_counts(engine)["run"] == before["run"] + 1
    finally:
        engine.dispose()


def test_ingest_stores_what_the_integrity_checks_found(engine):
    """A suspect run is stored with its reasons as its error, and each run's checks, passes, caching ratio and
    floors (the whole pass's on run, each conv layer's on layer_time); runs without the checks store nulls."""
    fixtures = integrity_results()
    for job_file in fixtures:
        ingest_result(engine, job_file, None)
    ingest_result(engine, make_result("reference", 8, profiler="cpu"), None)
    found = {m["measurement_id"]: m for job_file in fixtures for m in job_file["measurements"]}
    with Session(engine) as session:
        runs = session.scalars(select(Run).order_by(Run.id)).all()
        for run in runs:
            measurement = found.get(run.measurement_id)
            if measurement is None:  # the CPU reference: no checks ran
                assert (run.checks, run.checked_passes, run.caching_ratio, run.peak_floor_ms) == (None,) * 4
                assert {lt.peak_floor_ms for lt in run.layer_times} == {None}
                continue
            integrity = measurement["integrity"]
            assert (run.status, run.error) == (measurement["status"], measurement["error"])
            assert (run.checks, run.checked_passes, run.failed_pass, run.fresh_passes) == (
                integrity["checks"], integrity["checked_passes"], integrity["failed_pass"], integrity["fresh_passes"])
            assert run.caching_ratio == (integrity["caching"] or {}).get("ratio")
            assert run.peak_floor_ms == pytest.approx(integrity["floor_ms"]["forward"])
            assert {lt.layer: lt.peak_floor_ms for lt in run.layer_times} == pytest.approx(
                {layer: ms for layer, ms in integrity["floor_ms"].items() if layer != "forward"})
        assert [(run.variant, run.status, run.checks) for run in runs] == [
            ("naive", "ok", "full"), ("naive", "suspect", "full"), ("tiled", "ok", "fast"), ("reference", "ok", None)]
        suspect = next(run for run in runs if run.status == "suspect")
        assert suspect.error.startswith("conv1 took 0.05 ms, below the physical floor of 0.1038 ms")
        assert suspect.caching_ratio == pytest.approx(0.41) and suspect.failed_pass is None


def test_migrating_a_0011_database_adds_the_integrity_columns_and_back(db_url):
    """Runs stored before the checks keep what they had and get nulls; new runs store theirs beside them;
    the views carry the new columns, and a downgrade drops them and keeps every run."""
    results = standard_results()
    before = stored_the_old_way(db_url, "0011", results)
    engine = open_store(db_url)
    try:
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
            assert connection.exec_driver_sql(
                "SELECT COUNT(*) FROM run WHERE checks IS NOT NULL OR peak_floor_ms IS NOT NULL").scalar() == 0
            assert connection.exec_driver_sql(
                "SELECT COUNT(*) FROM layer_time WHERE peak_floor_ms IS NOT NULL").scalar() == 0
        assert row_counts(engine) == before
        for job_file in integrity_results():
            assert ingest_result(engine, job_file, None).added == len(job_file["measurements"])
        with engine.connect() as connection:
            stored = connection.exec_driver_sql("SELECT status, checks, error FROM run_summary "
                                                "WHERE checks IS NOT NULL ORDER BY run_id").all()
            assert [(status, checks) for status, checks, _ in stored] == [("ok", "full"), ("suspect", "full"),
                                                                          ("ok", "fast")]
            assert stored[1][2].startswith("conv1 took 0.05 ms")
        migrate(engine, "0011", downgrade=True)
        with engine.connect() as connection:
            schema = inspect(connection)
            assert not {"checks", "caching_ratio", "forward_floor_ms"} & {c["name"] for c in schema.get_columns("run")}
            assert "floor_ms" not in {c["name"] for c in schema.get_columns("layer_time")}
            assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0011_COLUMNS
            assert_latest_run_shows_every_run_column(connection)
        assert row_counts(engine)["run"] == before["run"] + 3
    finally:
        engine.dispose()


def test_migrating_a_0012_database_adds_the_input_format_and_back(db_url):
    """Runs stored before the axis shipped fp32 and say so; a run in another format stores it; the summary
    view carries it and the forward's floor; a downgrade drops them and keeps every run."""
    results = standard_results()
    before = stored_the_old_way(db_url, "0012", results)
    engine = open_store(db_url)
    try:
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
            assert {row[0] for row in connection.exec_driver_sql("SELECT DISTINCT input_format FROM run")} == {"fp32"}
        assert row_counts(engine) == before
        u8 = copy.deepcopy(results[0])  # the same cell shipped as bytes: another run key and measurement
        u8["spec"]["input_format"] = "u8"
        u8["run_key"], u8["measurement_id"] = canonical_hash(u8["spec"]), u8["measurement_id"][::-1]
        assert ingest_result(engine, u8, None).added == 1
        with engine.connect() as connection:
            formats = connection.exec_driver_sql("SELECT input_format, COUNT(*) FROM run_summary GROUP BY input_format "
                                                 "ORDER BY input_format").all()
            assert [name for name, _ in formats] == ["fp32", "u8"]
        migrate(engine, "0012", downgrade=True)
        with engine.connect() as connection:
            schema = inspect(connection)
            assert "input_format" not in {c["name"] for c in schema.get_columns("run")}
            assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0012_COLUMNS
            assert_latest_run_shows_every_run_column(connection)
        assert row_counts(engine)["run"] == before["run"] + 1
    finally:
        engine.dispose()


def test_migrating_a_0013_database_keeps_the_peak_floors_and_adds_the_measured_ones_and_back(db_url):
    """0014: the integrity checks' floors (at peak rates) keep their values as peak_floor_ms; the floors at
    measured rates start empty and fill when a bench file is stored; a downgrade puts the peak floors back."""
    results = standard_results()
    before = stored_the_old_way(db_url, "0013", results)
    old = engine_at(db_url, "0013")
    with _writer(old).begin() as connection:
        connection.exec_driver_sql("UPDATE run SET forward_floor_ms = 0.25")
        connection.exec_driver_sql("UPDATE layer_time SET floor_ms = 0.125")
    old.dispose()
    engine = open_store(db_url)
    try:
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            assert_latest_run_shows_every_run_column(connection)
            assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS
            assert set(connection.exec_driver_sql("SELECT peak_floor_ms, forward_floor_ms FROM run").all()) == {(0.25, None)}
            assert set(connection.exec_driver_sql("SELECT peak_floor_ms, floor_ms FROM layer_time").all()) == {(0.125, None)}
        assert row_counts(engine) == before
        bench = {"format": "bench-2", "bench_id": "b" * 32, "measured_at": "2026-11-26T06:00:00+00:00",
                 "device": results[0]["environment"]["gpu"], "ceilings": {"dtod_GBps": 3000.0}}
        assert ingest_result(engine, bench, None).added == 1
        with engine.connect() as connection:  # the old files never said what crossed the bus: layer floors only
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM layer_time WHERE floor_ms > 0").scalar() == 2 * len(
                [r for r in results if r["floors"]])
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM run WHERE forward_floor_ms IS NOT NULL").scalar() == 0
        migrate(engine, "0013", downgrade=True)
        with engine.connect() as connection:
            schema = inspect(connection)
            assert "device_ceiling" not in schema.get_table_names()
            assert set(connection.exec_driver_sql("SELECT forward_floor_ms FROM run").all()) == {(0.25,)}
            assert set(connection.exec_driver_sql("SELECT floor_ms FROM layer_time").all()) == {(0.125,)}
            assert [c["name"] for c in schema.get_columns("run_summary")] == RUN_SUMMARY_0013_COLUMNS
            assert_latest_run_shows_every_run_column(connection)
        assert row_counts(engine)["run"] == before["run"]
    finally:
        engine.dispose()


def test_a_postgresql_url_without_the_postgres_extra_names_the_extra(monkeypatch, capsys):
    """Without psycopg (`pip install -e .`, no extras) a PostgreSQL URL said only "No module named 'psycopg'"."""
    import importlib.abc

    class NoPsycopg(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] == "psycopg":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.delitem(sys.modules, "psycopg", raising=False)
    monkeypatch.setattr(sys, "meta_path", [NoPsycopg(), *sys.meta_path])
    url = "postgresql://someone:s3cret@127.0.0.1:1/convsweep"
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert str(caught.value) == ("postgresql+psycopg://someone:***@127.0.0.1:1/convsweep needs the PostgreSQL driver "
                                 "psycopg, which the postgres extra installs: pip install -e '.[postgres]' "
                                 "(No module named 'psycopg')")
    assert cli_main(["query", "--db", url, "runs"]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "pip install -e '.[postgres]'" in said and "s3cret" not in said
