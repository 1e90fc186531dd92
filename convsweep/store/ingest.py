"""Idempotent ingest of the files convsweep writes, one transaction per file, nothing half-stored: per-job
result files (workflow/schemas/result.schema.yaml, explained in docs/result-format.md), and beside them
Nsight Compute profiles, confirmations and bench files' rates. FORMATS, the table of them, says per file
`format` what it is checked against, which id makes ingesting it again add nothing, and what stores it.

A result file holds one measurement (formats 1 and 2) or one per tunable setting of its job (format 3);
each is a run row. The file is read strictly (strict_json), checked against the schema, then read as a
convsweep.measure.record.ResultFile, whose measurements name their own columns."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Engine, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from convsweep.base.errors import ConfigError, StoreError, StoreUnavailable
from convsweep.base.fileio import canonical_hash
from convsweep.base.progress import progress
from convsweep.base.schema import validate
from convsweep.measure.files import BenchFile, ConfirmFile, ProfileFile
from convsweep.measure.record import File, Measurement, ResultFile

from .ceilings import latest_ceiling, set_floors, store_ceiling
from .engine import _writer, one_line, storing
from .ingest_report import IngestReport
from .models import (Build, Confirmation, DeviceCeiling, Environment, KernelProfile, KernelStat, LayerTime, Memcpy,
                     Phase, Run, Sample, Sweep)
from .confirmations import ingest_confirmation
from .profiles import ingest_profile
from convsweep.base.strict_json import check_schema, check_values, read_json, utc_time

# Transactions per file when another writer stores some of its measurements between our check and
# our insert (that insert fails; the next attempt sees them stored and skips them).
RACE_ATTEMPTS = 3


def check_result(result: Any, source: str, schema: str | None = "result") -> None:
    """Raise StoreError naming the file and key when a file holds a number no column can (NaN and
    infinities, which JSON Schema cannot see) or does not match its schema (None: no schema)."""
    check_values(result, source)
    if schema is not None:
        check_schema(result, schema, source)


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


def ingest_result(engine: Engine, result: Any, result_path: str | None = None) -> IngestReport:
    """Store one file that convsweep writes, of a format FORMATS knows, in one transaction: checked first
    (values, then its schema), and refused with one line naming the file and the formats known where its
    `format` is none of them."""
    entry = file_format(result)
    source = result_path or (entry.named(result) if entry is not None else "a document")
    check_result(result, source, entry.schema if entry is not None else None)
    if entry is None:
        raise unknown_format(result, source)
    return entry.store(engine, result, source, result_path)


def ingest_measurements(engine: Engine, result: dict[str, Any], source: str, result_path: str | None) -> IngestReport:
    """Store a checked result file: each of its measurements not stored yet becomes a run row, or, when
    anything fails, none does. A new measurement of a stored setting is a new row beside the old ones;
    one already stored counts as unchanged."""
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


@dataclass(frozen=True)
class FileFormat:
    """A kind of file ingest stores. `record`: its typed record (convsweep.measure), whose FORMATS are the
    `format` values it is known by; `kind` and `named_by`: what error lines call one handed in without a path
    (`profile <its job_id>`); `schema`: what it is checked against (workflow/schemas/; None: the bench file
    has none, and its store checks each key it reads); `id_column`: where its id is stored (a result file's:
    its measurements'), which `store` looks up in the transaction that stores it, so that ingesting the file
    again adds nothing; `store`: (engine, the checked file, source: what error lines call it, path: where it
    was read from, None for a document handed in) -> what it stored."""

    record: type[File]
    kind: str
    named_by: str
    schema: str | None
    id_column: InstrumentedAttribute[str]
    store: Callable[[Engine, dict[str, Any], str, str | None], IngestReport]

    def named(self, document: dict[str, Any]) -> str:
        """What error lines call a document of this kind handed in without a path."""
        return f"{self.kind} {document.get(self.named_by, '?')}"


FORMATS = (
    FileFormat(ResultFile, "result", "job_id", "result", Run.measurement_id, ingest_measurements),
    FileFormat(ProfileFile, "profile", "job_id", "profile", KernelProfile.profile_id, ingest_profile),
    FileFormat(ConfirmFile, "confirmation", "group_id", "confirm", Confirmation.confirmation_id, ingest_confirmation),
    FileFormat(BenchFile, "bench", "bench_id", None, DeviceCeiling.bench_id, store_ceiling),  # `convsweep bench --json`
)
KNOWN_FORMATS: list[int | str] = [known for entry in FORMATS for known in entry.record.FORMATS]


def file_format(document: Any) -> FileFormat | None:
    """The entry of a document's `format`; None where it is not an object or has no format FORMATS knows."""
    found = document.get("format") if isinstance(document, dict) else None
    if isinstance(found, bool):  # True == 1: not format 1 for all that
        return None
    return next((entry for entry in FORMATS if found in entry.record.FORMATS), None)


def unknown_format(document: Any, source: str) -> StoreError:
    """The line refusing a document of no format FORMATS knows, worded as the schemas' lines are:
    `f.json: format: expected one of [1, 2, 3, 'ncu-1', ...], got "x"`."""
    shown = document
    if isinstance(document, dict):  # its format alone: the rest is no concern of this line
        shown = {"format": document["format"]} if "format" in document else {}
    formats = {"type": "object", "required": ["format"], "properties": {"format": {"enum": KNOWN_FORMATS}}}
    try:
        validate(shown, formats, source, fill_defaults=False)
    except ConfigError as exc:
        return StoreError(str(exc))
    # Only a value that jsonschema's enum takes and `in` does not (JSON has none) gets here.
    return StoreError(f"{source}: format: expected one of {KNOWN_FORMATS}, got {shown['format']!r}")


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
