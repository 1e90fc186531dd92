"""Idempotent ingest of per-job result JSON files (workflow/schemas/result.schema.yaml, explained
in docs/result-format.md): one transaction per file, nothing half-stored. A file holds one
measurement (formats 1 and 2) or one per tunable setting of its job (format 3); each is a run row.
The file is read strictly (strict_json), checked against the schema, then read as a
convsweep.measure.record.ResultFile, whose measurements name their own columns."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Engine, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from convsweep.base.errors import StoreError, StoreUnavailable
from convsweep.base.fileio import canonical_hash
from convsweep.base.progress import progress
from convsweep.measure.record import Measurement, ResultFile

from .ceilings import BENCH_FORMAT, ingest_ceiling, latest_ceiling, set_floors
from .engine import _writer, one_line, storing
from .ingest_report import IngestReport
from .models import Build, Environment, KernelStat, LayerTime, Memcpy, Phase, Run, Sample, Sweep
from .confirmations import ingest_confirmation
from .profiles import ingest_profile
from convsweep.base.strict_json import check_schema, check_values, read_json, utc_time


PROFILE_FORMAT = "ncu-1"  # convsweep.measure.ncu.FORMAT, named here so ingest never imports the profiler
CONFIRM_FORMAT = "confirm-1"  # convsweep.measure.confirm.FORMAT

# Transactions per file when another writer stores some of its measurements between our check and
# our insert (that insert fails; the next attempt sees them stored and skips them).
RACE_ATTEMPTS = 3


def check_result(result: Any, source: str) -> None:
    """Raise StoreError naming the file and key when a result does not match the result schema or
    holds a number no column can (NaN and infinities, which JSON Schema cannot see)."""
    check_values(result, source)
    check_schema(result, "result", source)


def _get_or_create(session: Session, model: type[Sweep | Environment | Build], keys: dict[str, Any],
                   values: dict[str, Any]) -> int:
    """The id of the row with these key columns, inserted if missing; safe against concurrent inserts.
    Remembered for the session's transaction: a file's settings share their sweep, environment and
    layers build, which would otherwise cost two statements per setting each."""
    known = session.info.setdefault("ids", {})
    memo_key = (model.__tablename__, tuple(sorted(keys.items())))
    if memo_key not in known:
        known[memo_key] = _find_or_insert(session, model, keys, values)
    return known[memo_key]


def _find_or_insert(session: Session, model: type[Sweep | Environment | Build], keys: dict[str, Any],
                    values: dict[str, Any]) -> int:
    dialect = session.get_bind().dialect.name
    row = {**values, **keys}
    if dialect in ("postgresql", "sqlite"):
        insert_fn = pg_insert if dialect == "postgresql" else sqlite_insert
        session.execute(insert_fn(model).values(row).on_conflict_do_nothing(index_elements=list(keys)))
    else:
        found = session.scalar(select(model.id).filter_by(**keys))
        if found is not None:
            return found
        session.execute(insert(model).values(row))
    return cast(int, session.scalar(select(model.id).filter_by(**keys)))  # found, or inserted just now


def measurements(result: ResultFile, source: str) -> list[tuple[str, Measurement]]:
    """(key path prefix, measurement) of each measurement of a checked result file. StoreError when
    two share a measurement id, one names another job than the file's, or one's run_key is not its
    spec's: the views take each run_key's newest row as the setting's latest measurement, so a key
    that is not its spec's would stand in for another setting's."""
    found = result.located()
    first_at: dict[str, int] = {}
    for index, (where, measurement) in enumerate(found):
        key = measurement.measurement_id
        if key in first_at:
            raise StoreError(f"{source}: {where}measurement_id: {key!r} is measurements[{first_at[key]}]'s too")
        first_at[key] = index
        if measurement.run_key != (spec_key := canonical_hash(measurement.spec)):
            raise StoreError(f"{source}: {where}run_key: {measurement.run_key!r} does not match its spec "
                             f"(whose key is {spec_key!r})")
        if result.job_key is not None:
            assert measurement.grid is not None  # a format 3 file's (it has a job_key): the schema requires it
            if measurement.grid.job_key != result.job_key:
                raise StoreError(f"{source}: {where}grid.job_key: expected the file's job_key {result.job_key!r}, "
                                 f"got {measurement.grid.job_key!r}")
    return found


def ingest_result(engine: Engine, result: dict[str, Any], result_path: str | None = None) -> IngestReport:
    """Store one result file in one transaction: each of its measurements not stored yet becomes a
    run row, or, when anything fails, none does. A new measurement of a stored setting is a new
    row beside the old ones; one already stored counts as unchanged."""
    if isinstance(result, dict) and result.get("format") == PROFILE_FORMAT:  # an Nsight Compute profile job's file
        check_values(result, result_path or f"profile {result.get('job_id', '?')}")
        return ingest_profile(engine, result, result_path)
    if isinstance(result, dict) and result.get("format") == CONFIRM_FORMAT:  # a confirm job's: a cell's winners
        check_values(result, result_path or f"confirmation {result.get('group_id', '?')}")
        return ingest_confirmation(engine, result, result_path)
    if isinstance(result, dict) and result.get("format") == BENCH_FORMAT:  # `convsweep bench --json`: a GPU's rates
        return ingest_ceiling(engine, result, result_path)
    source = result_path or f"result {result.get('job_id', '?') if isinstance(result, dict) else '?'}"
    check_result(result, source)
    found = measurements(ResultFile.from_json(result), source)
    keys = [m.measurement_id for _, m in found]
    attempts = 0
    with storing(source):
        while True:
            attempts += 1
            try:
                return _store(engine, found, keys, result_path, source)
            except IntegrityError as exc:
                # Another writer may have stored some of them between our check and our insert: look again.
                with Session(engine) as session:
                    raced = bool(_stored_ids(session, keys))
                if not raced or attempts == RACE_ATTEMPTS:
                    raise StoreError(f"cannot store {source}: {one_line(exc)}") from None


def _stored_ids(session: Session, keys: list[str]) -> set[str]:
    """Those of `keys` that name a stored measurement."""
    return set(session.scalars(select(Run.measurement_id).where(Run.measurement_id.in_(keys))))


def _store(engine: Engine, found: list[tuple[str, Measurement]], keys: list[str], result_path: str | None,
           source: str) -> IngestReport:
    """One transaction: a run row for each measurement not stored yet."""
    report = IngestReport()
    with Session(_writer(engine)) as session, session.begin():
        stored = _stored_ids(session, keys)
        for (where, measurement), key in zip(found, keys):
            if key in stored:
                report.unchanged += 1
                continue
            session.add(_run_row(session, measurement, result_path, source, where))
            report.added += 1
            report.added_by_status[measurement.status] += 1
    return report


def _run_row(session: Session, measurement: Measurement, result_path: str | None, source: str,
             where: str = "") -> Run:
    """The run row of one measurement, with its child rows; `where` is its key path in the file
    (measurements[i].). The sweep, environment and builds it shares with others are stored once."""
    now = datetime.now(timezone.utc)
    sweep = measurement.sweep_columns()
    sweep_id = _get_or_create(session, Sweep, {k: sweep.pop(k) for k in ("experiment", "config_hash")},
                              {**sweep, "created_at": now})
    environment = measurement.environment_columns()
    gpu = environment.get("gpu")
    environment_id = _get_or_create(session, Environment, {"env_hash": environment.pop("env_hash")}, environment)
    build_ids = {_get_or_create(session, Build, {"build_key": build.pop("build_key")}, build)
                 for build in measurement.build_rows()}
    columns = measurement.run_columns()
    columns["started_at"] = utc_time(measurement.started_at, source, f"{where}started_at")
    run = Run(**columns, sweep_id=sweep_id, environment_id=environment_id, ingested_at=now, result_path=result_path)
    run.builds = [cast(Build, session.get(Build, build_id)) for build_id in sorted(build_ids)]  # stored above
    run.samples = [Sample(**row) for row in measurement.sample_rows()]
    run.kernels = [KernelStat(**row) for row in measurement.kernel_rows()]
    run.memcpys = [Memcpy(**row) for row in measurement.memcpy_rows()]
    run.layer_times = [LayerTime(**row) for row in measurement.layer_time_rows()]
    run.phase_times = [Phase(**row) for row in measurement.phase_rows()]
    ceilings = session.info.setdefault("ceilings", {})  # the GPU's latest rates, looked up once a transaction
    if gpu not in ceilings:
        ceilings[gpu] = latest_ceiling(session, gpu)
    set_floors(run, run.layer_times, ceilings[gpu])
    return run


def read_result(path: str | Path) -> Any:
    """One result file, parsed strictly (strict_json.read_json); a file that cannot be read, is not
    JSON, or holds a number no column can, raises StoreError naming the file and the key."""
    return read_json(path)


def ingest_files(engine: Engine, paths: Iterable[str | Path]) -> IngestReport:
    """Ingest result files one transaction each, counting measurements. A file that cannot be read
    or stored becomes one line of the report's errors and the others go on; only a database that
    cannot be used at all (StoreUnavailable) stops it. Many files show a progress bar (convsweep.base.progress)."""
    report = IngestReport()
    paths = list(paths)
    for path in progress(paths, desc="ingest", unit="file", enabled=len(paths) > 1):
        try:
            report.merge(ingest_result(engine, read_result(path), str(path)))
        except StoreUnavailable:
            raise
        except StoreError as exc:
            report.errors.append(str(exc))
        except Exception as exc:
            # Whatever one file runs into (a string no driver can encode, an int SQLite cannot bind, a
            # bug), the rest are stored; its session's `with` has already rolled its transaction back.
            detail = " ".join(str(exc).split())
            report.errors.append(f"{path}: cannot ingest: {type(exc).__name__}" + (f": {detail}" if detail else ""))
    return report
