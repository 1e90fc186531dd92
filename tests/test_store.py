"""The result store on SQLite and PostgreSQL: schema, idempotent ingest, atomicity, errors."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, Engine, MetaData, delete, func, insert, inspect, select
from sqlalchemy.orm import Session

from convsweep.errors import StoreError
from convsweep.store import (
    Base,
    StoreUnavailable,
    Build,
    LayerTime,
    Run,
    _run_row,
    _writer,
    alembic_config,
    ingest_files,
    ingest_result,
    make_engine,
    migrate,
    open_store,
    read_result,
    resolve_url,
    sha256_json,
    sqlite_path,
    variant_label,
)
from store_fixtures import as_format_1, make_result, row_counts, standard_results, write_results

RUN_SUMMARY_0001_COLUMNS = [
    "experiment", "variant", "batch", "streams", "host_memory", "status", "op_time_1_ms",
    "op_time_2_ms", "forward_ms", "total_s", "accuracy", "max_rel_err", "profiler", "run_id",
]
RUN_SUMMARY_0002_COLUMNS = RUN_SUMMARY_0001_COLUMNS[:-1] + ["prediction_agreement", "run_id"]
RUN_SUMMARY_COLUMNS = RUN_SUMMARY_0002_COLUMNS[:-1] + ["job_id", "started_at", "run_id"]


@pytest.fixture
def engine(db_url):
    engine = open_store(db_url)
    yield engine
    engine.dispose()


def test_migration_matches_models(engine):
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == []
        assert [c["name"] for c in inspect(connection).get_columns("run_summary")] == RUN_SUMMARY_COLUMNS


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


def test_ingest_stores_everything(engine):
    result = make_result({"conv1": "naive", "conv2": "tiled"}, batch=1000, op_time_ms=(0.74, 1.2))
    assert ingest_result(engine, result, "results/x/runs/a.json") is True
    counts = row_counts(engine)
    assert counts == {"sweep": 1, "environment": 1, "build": 2, "run": 1, "run_build": 2,
                      "sample": 9, "kernel": 2, "memcpy": 2, "layer_time": 2}
    with Session(engine) as session:
        run = session.scalars(select(Run)).one()
        assert run.variant == "conv1=naive,conv2=tiled"
        assert (run.op_time_1_ms, run.op_time_2_ms) == (0.74, 1.2)
        assert run.op_time_ms == {"conv1": 0.74, "conv2": 1.2}
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


def test_ingest_stores_phases_chunk_size_and_each_layers_variant(engine):
    result = make_result({"conv1": "naive", "conv2": "tiled"}, batch=1000)
    result["spec"]["chunk_images"] = 250
    ingest_result(engine, result, None)
    ingest_result(engine, make_result("naive", 100), None)  # automatic chunking: no chunk_images key
    with Session(engine) as session:
        mixed, plain = session.scalars(select(Run).order_by(Run.batch.desc())).all()
        assert {p.name: p.seconds for p in mixed.phase_times} == result["phases_s"]
        assert (mixed.chunk_images, plain.chunk_images) == (250, None)
        assert {t.layer: t.variant for t in mixed.layer_times} == {"conv1": "naive", "conv2": "tiled"}


def test_failed_runs_keep_their_floors_in_layer_time(engine):
    ingest_result(engine, make_result("broken", 100, status="failed"), None)
    # A job that failed before it knew its shapes writes "floors": {} (convsweep/job.py)
    ingest_result(engine, make_result("broken", 200, status="failed", floors={}), None)
    # Floors and op times may name a layer spec.variants does not: it gets a row too
    extra = make_result("naive", 300)
    extra["floors"]["conv3"] = {"bytes": 7, "flops": 9}
    ingest_result(engine, extra, None)
    assert layer_rows(engine) == {
        ("broken", 100, "conv1", None, 200_000_000, 4_001_000),
        ("broken", 100, "conv2", None, 400_000_000, 8_001_000),
        ("broken", 200, "conv1", None, None, None),
        ("broken", 200, "conv2", None, None, None),
        ("naive", 300, "conv1", 0.74, 600_000_000, 12_001_000),
        ("naive", 300, "conv2", 1.76, 1_200_000_000, 24_001_000),
        ("naive", 300, "conv3", None, 9, 7),
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
    ({"floors": [1]}, r"key 'floors' must be an object of layer -> \{bytes, flops\} or null"),
    ({"floors": {"conv1": 12}}, r"key 'floors' must be an object"),
    ({"floors": {"conv1": {"bytes": 1, "flops": 1.5}}}, r"key 'floors\.conv1\.flops' must be an integer or null"),
    ({"floors": {"conv1": {"bytes": "many", "flops": 1}}}, r"key 'floors\.conv1\.bytes' must be an integer"),
    ({"timings": {"op_time_ms": [0.7, 1.2]}}, r"key 'timings\.op_time_ms' must be an object"),
])
def test_bad_floors_and_op_times_are_refused(engine, overrides, message):
    with pytest.raises(StoreError, match=rf"^f\.json: {message}"):
        ingest_result(engine, make_result(**overrides), "f.json")
    assert set(row_counts(engine).values()) == {0}


def test_variant_label():
    assert variant_label({"conv1": "naive", "conv2": "naive"}) == "naive"
    assert variant_label({"conv1": "naive", "conv2": "tiled"}) == "conv1=naive,conv2=tiled"


def test_shared_sweep_environment_and_builds_are_stored_once(engine):
    for batch in (100, 1000, 10000):
        assert ingest_result(engine, make_result("naive", batch), None)
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
    assert ingest_result(engine, read_result(paths[0]), None) is False


def test_a_new_measurement_of_a_stored_job_is_a_new_row_and_the_latest_is_summarized(engine):
    """Re-measuring a job (its kernel edited, say) keeps both rows; latest_run and run_summary show
    the newer by started_at, whatever order they were ingested in."""
    old = make_result("naive", 100, op_time_ms=(0.9, 1.9), started_at="2026-11-22T18:40:00+00:00")
    new = make_result("naive", 100, op_time_ms=(0.5, 1.5), started_at="2026-11-23T09:00:00+00:00",
                      sources={"kernels/naive.cu": "f" * 64})
    assert old["run_key"] == new["run_key"] and old["measurement_id"] != new["measurement_id"]
    assert ingest_result(engine, new, None) and ingest_result(engine, old, None)
    assert ingest_result(engine, new, None) is False
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


def test_failure_mid_ingest_leaves_no_row(engine):
    result = make_result()
    result["samples"][2]["value"] = None
    with pytest.raises(StoreError, match=r"^cannot store results/bad\.json: .*") as caught:
        ingest_result(engine, result, "results/bad.json")
    assert "\n" not in str(caught.value)
    assert set(row_counts(engine).values()) == {0}
    assert ingest_result(engine, make_result(), None) is True


def test_concurrent_ingests_of_one_run_store_it_once(engine):
    result = make_result()
    barrier = threading.Barrier(4)
    outcomes = []

    def ingest():
        barrier.wait()
        outcomes.append(ingest_result(engine, result, None))

    threads = [threading.Thread(target=ingest) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [False, False, False, True]
    assert row_counts(engine)["run"] == 1 and row_counts(engine)["sample"] == 9


def test_ingest_racing_an_uncommitted_insert_of_the_same_run(engine):
    # The other writer holds the run uncommitted: PostgreSQL makes our insert wait on the unique
    # index and then fail (handled as unchanged); SQLite makes our BEGIN IMMEDIATE wait.
    result = make_result()
    outcomes = []
    with Session(_writer(engine)) as other, other.begin():
        other.add(_run_row(other, result, None, "other"))
        other.flush()
        racer = threading.Thread(target=lambda: outcomes.append(ingest_result(engine, result, None)))
        racer.start()
        time.sleep(0.5)
        assert outcomes == []
    racer.join()
    assert outcomes == [False]
    assert row_counts(engine)["run"] == 1


def test_concurrent_ingests_of_runs_sharing_a_sweep(engine):
    results = [make_result("naive", batch) for batch in (1, 2, 3, 4, 5, 6)]
    barrier = threading.Barrier(len(results))
    errors = []

    def ingest(result):
        barrier.wait()
        try:
            ingest_result(engine, result, None)
        except StoreError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ingest, args=(r,)) for r in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
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
    assert report.errors[2].startswith(f"{no_key_path}: key 'measurement_id' must be a string (result format 2)")
    assert row_counts(engine)["run"] == 2


@pytest.mark.parametrize("section, key", [("", "run_key"), ("spec", "batch"), ("sweep", "config_hash")])
def test_missing_key_names_file_and_key(engine, tmp_path, section, key):
    result = make_result()
    del (result[section] if section else result)[key]
    [path] = write_results(tmp_path / "runs", [result])
    dotted = f"{section}.{key}" if section else key
    assert ingest_files(engine, [path]).errors == [f"{path}: missing key '{dotted}'"]
    assert row_counts(engine)["run"] == 0


def test_started_at_with_z_suffix_and_bad_lists(engine):
    assert ingest_result(engine, make_result(started_at="2026-11-22T18:40:00Z"), None)
    with pytest.raises(StoreError, match=r"d\.json: key 'started_at' is not an ISO 8601 time"):
        ingest_result(engine, make_result(batch=7, started_at="yesterday"), "d.json")
    with pytest.raises(StoreError, match=r"e\.json: key 'samples' must be a list of objects"):
        ingest_result(engine, make_result(batch=8, samples=[1.0]), "e.json")
    assert row_counts(engine)["run"] == 1


def test_wrong_format_and_status_are_refused(engine):
    with pytest.raises(StoreError, match=r"a\.json: result format 3 is not supported \(expected one of 1, 2\)"):
        ingest_result(engine, make_result(format=3), "a.json")
    with pytest.raises(StoreError, match=r"b\.json: key 'status' is 'great'"):
        ingest_result(engine, {**make_result(), "status": "great"}, "b.json")
    with pytest.raises(StoreError, match=r"c\.json: expected a JSON object"):
        ingest_result(engine, [1, 2], "c.json")


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


def test_result_file_round_trip_keeps_path(engine, tmp_path):
    [path] = write_results(tmp_path / "runs", [make_result()])
    ingest_files(engine, [path])
    with Session(engine) as session:
        assert session.scalars(select(Run.result_path)).one() == str(path)
    assert json.loads(Path(path).read_text())["run_key"]


# --- migrations ---------------------------------------------------------------------------


def layer_rows(engine: Engine) -> set[tuple[Any, ...]]:
    """Every layer_time row as (variant, batch, layer, op_time_ms, flops, bytes)."""
    with engine.connect() as connection:
        return {tuple(row) for row in connection.execute(
            select(Run.variant, Run.batch, LayerTime.layer, LayerTime.op_time_ms, LayerTime.flops, LayerTime.bytes)
            .join(Run, Run.id == LayerTime.run_id))}


def expected_layer_rows(results: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    rows = set()
    for result in results:
        op_time_ms = result["timings"]["op_time_ms"] or {}
        for layer in result["spec"]["variants"]:
            floor = result["floors"].get(layer, {})
            rows.add((variant_label(result["spec"]["variants"]), result["spec"]["batch"], layer,
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


def insert_at_0001(connection: Connection, result: dict[str, Any]) -> None:
    """Store a result the way a 0001 database held it: the tables as they are there, no models."""
    tables = MetaData()
    tables.reflect(connection, only=["sweep", "environment", "run", "sample"])
    sweep, environment, run, sample = (tables.tables[t] for t in ("sweep", "environment", "run", "sample"))
    spec, now = result["spec"], datetime.now(timezone.utc)
    keys = {"experiment": result["sweep"]["experiment"], "config_hash": result["sweep"]["config_hash"]}
    sweep_id = connection.scalar(select(sweep.c.id).filter_by(**keys))
    if sweep_id is None:
        sweep_id = connection.scalar(insert(sweep).values(**keys, created_at=now).returning(sweep.c.id))
    env_hash = sha256_json(result["environment"])
    environment_id = connection.scalar(select(environment.c.id).filter_by(env_hash=env_hash))
    if environment_id is None:
        environment_id = connection.scalar(
            insert(environment).values(env_hash=env_hash, gpu=result["environment"]["gpu"]).returning(environment.c.id))
    op_time_ms = result["timings"]["op_time_ms"]
    layers = list(spec["variants"])
    run_id = connection.scalar(insert(run).values(
        run_key=result["run_key"], job_id=result["job_id"], sweep_id=sweep_id, environment_id=environment_id,
        experiment=spec["experiment"], network=spec["network"], dataset=spec["dataset"],
        variants=spec["variants"], params=spec["params"], variant=variant_label(spec["variants"]),
        batch=spec["batch"], streams=spec["streams"], host_memory=spec["host_memory"],
        status=result["status"], accuracy=result["accuracy"],
        op_time_1_ms=(op_time_ms or {}).get(layers[0]), op_time_2_ms=(op_time_ms or {}).get(layers[1]),
        op_time_ms=op_time_ms, forward_ms=result["timings"]["forward_ms"], floors=result["floors"],
        ingested_at=now,
    ).returning(run.c.id))
    for s in result["samples"]:
        connection.execute(insert(sample).values(run_id=run_id, metric=s["metric"], layer=s["layer"],
                                                 repeat=s["repeat"], value=s["value"]))


def test_migrating_a_0001_database_backfills_layer_time(db_url):
    results = standard_results() + [make_result("naive", 10, status="failed", floors={})]
    old = engine_at(db_url, "0001")
    with _writer(old).begin() as connection:
        assert "layer_time" not in inspect(connection).get_table_names()
        for result in results:
            insert_at_0001(connection, result)
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
        assert [ingest_result(engine, as_format_1(result), None) for result in results] == [False] * 7
        assert ingest_result(engine, make_result("tiled", 5000), None) is True
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
