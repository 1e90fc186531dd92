"""The result store: SQLAlchemy models of runs and their builds, samples and profiles, and the
idempotent ingest of per-job result JSON files (workflow/schemas/result.schema.yaml, explained in
docs/result-format.md) into SQLite or PostgreSQL."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from convsweep.config import variant_label
from convsweep.errors import ConfigError, StoreError, StoreUnavailable
from convsweep.fileio import canonical_hash
from convsweep.paths import DEFAULT_DB_URL, MIGRATIONS_DIR
from convsweep.schema import validate

PG_CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Serializes concurrent migrations on one PostgreSQL database (any constant, unique to us).
_PG_MIGRATION_LOCK = 0x636F6E76

# Deterministic constraint names, so the hand-written migration and the models agree.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


run_build = Table(
    "run_build",
    Base.metadata,
    Column("run_id", ForeignKey("run.id", ondelete="CASCADE"), primary_key=True),
    Column("build_id", ForeignKey("build.id", ondelete="CASCADE"), primary_key=True, index=True),
)


class Sweep(Base):
    __tablename__ = "sweep"
    __table_args__ = (UniqueConstraint("experiment", "config_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment: Mapped[str] = mapped_column(String)
    config_hash: Mapped[str] = mapped_column(String)
    config_path: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Environment(Base):
    __tablename__ = "environment"

    id: Mapped[int] = mapped_column(primary_key=True)
    env_hash: Mapped[str] = mapped_column(String, unique=True)
    hostname: Mapped[str | None] = mapped_column(String)
    gpu: Mapped[str | None] = mapped_column(String)
    gpu_uuid: Mapped[str | None] = mapped_column(String)  # NVML's GPU-... name of the device
    compute_capability: Mapped[str | None] = mapped_column(String)
    driver: Mapped[str | None] = mapped_column(String)  # the display driver (NVML), e.g. 580.95.05
    cuda_driver: Mapped[str | None] = mapped_column(String)  # the CUDA version the driver supports
    nvrtc: Mapped[str | None] = mapped_column(String)
    nsys: Mapped[str | None] = mapped_column(String)
    python: Mapped[str | None] = mapped_column(String)
    packages: Mapped[dict[str, Any] | None]


class Build(Base):
    __tablename__ = "build"

    id: Mapped[int] = mapped_column(primary_key=True)
    build_key: Mapped[str] = mapped_column(String, unique=True)
    variant: Mapped[str] = mapped_column(String)
    params: Mapped[dict[str, Any] | None]
    arch: Mapped[str | None] = mapped_column(String)
    options_hash: Mapped[str | None] = mapped_column(String)
    source_hash: Mapped[str | None] = mapped_column(String)
    compile_ms: Mapped[float | None] = mapped_column(Float)
    cache_hit: Mapped[bool | None] = mapped_column(Boolean)
    log: Mapped[str | None] = mapped_column(Text)
    kernels: Mapped[list[Any] | None]


class Run(Base):
    """One measurement of one job. A job (run_key: the hash of its settings) measured again, say
    after its kernel changed, gets a new row; the latest_run view keeps the newest per job."""

    __tablename__ = "run"
    __table_args__ = (Index(None, "experiment", "variant", "batch", "streams"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    measurement_id: Mapped[str] = mapped_column(String, unique=True)
    run_key: Mapped[str] = mapped_column(String, index=True)
    job_id: Mapped[str] = mapped_column(String)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweep.id"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environment.id"), index=True)
    experiment: Mapped[str] = mapped_column(String)
    network: Mapped[str] = mapped_column(String)
    dataset: Mapped[str | None] = mapped_column(String)
    variants: Mapped[dict[str, Any]]
    params: Mapped[dict[str, Any] | None]
    variant: Mapped[str] = mapped_column(String)
    batch: Mapped[int] = mapped_column(Integer)
    streams: Mapped[int] = mapped_column(Integer)
    host_memory: Mapped[str] = mapped_column(String)
    repeats: Mapped[int | None] = mapped_column(Integer)
    warmup: Mapped[int | None] = mapped_column(Integer)
    profiler_requested: Mapped[str | None] = mapped_column(String)
    profiler: Mapped[str | None] = mapped_column(String)
    status: Mapped[str] = mapped_column(String)
    error: Mapped[str | None] = mapped_column(Text)
    accuracy: Mapped[float | None] = mapped_column(Float)
    prediction_agreement: Mapped[float | None] = mapped_column(Float)
    chunk_images: Mapped[int | None] = mapped_column(Integer)  # null: the automatic chunking
    max_rel_err: Mapped[float | None] = mapped_column(Float)
    tolerance: Mapped[float | None] = mapped_column(Float)
    images_unique: Mapped[int | None] = mapped_column(Integer)
    cycled: Mapped[bool | None] = mapped_column(Boolean)
    h2d_ms: Mapped[float | None] = mapped_column(Float)
    d2h_ms: Mapped[float | None] = mapped_column(Float)
    compute_ms: Mapped[float | None] = mapped_column(Float)
    forward_ms: Mapped[float | None] = mapped_column(Float)
    overlap: Mapped[float | None] = mapped_column(Float)
    total_s: Mapped[float | None] = mapped_column(Float)
    compile_ms: Mapped[float | None] = mapped_column(Float)
    phases: Mapped[dict[str, Any] | None]
    floors: Mapped[dict[str, Any] | None]
    files: Mapped[dict[str, Any] | None]
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    result_path: Mapped[str | None] = mapped_column(String)
    # What the measurement was taken from (docs/result-format.md).
    source_hash: Mapped[str | None] = mapped_column(String)  # of all its kernel files together
    sources: Mapped[dict[str, Any] | None]  # kernel file -> its source hash
    git_commit: Mapped[str | None] = mapped_column(String)
    git_dirty: Mapped[bool | None] = mapped_column(Boolean)
    sm_clock_mhz: Mapped[int | None] = mapped_column(Integer)  # at the start of the timed part
    memory_clock_mhz: Mapped[int | None] = mapped_column(Integer)

    sweep: Mapped[Sweep] = relationship()
    environment: Mapped[Environment] = relationship()
    builds: Mapped[list[Build]] = relationship(secondary=run_build)
    samples: Mapped[list[Sample]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    kernels: Mapped[list[KernelStat]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    memcpys: Mapped[list[Memcpy]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    layer_times: Mapped[list[LayerTime]] = relationship(cascade="all, delete-orphan", passive_deletes=True,
                                                        order_by="LayerTime.layer_index")
    phase_times: Mapped[list[Phase]] = relationship(cascade="all, delete-orphan", passive_deletes=True)


class Sample(Base):
    __tablename__ = "sample"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    metric: Mapped[str] = mapped_column(String)
    layer: Mapped[str | None] = mapped_column(String)
    repeat: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)


class KernelStat(Base):
    __tablename__ = "kernel"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    layer: Mapped[str | None] = mapped_column(String)
    name: Mapped[str] = mapped_column(String)
    launches: Mapped[int | None] = mapped_column(Integer)
    total_ms: Mapped[float | None] = mapped_column(Float)
    median_ms: Mapped[float | None] = mapped_column(Float)
    grid: Mapped[list[Any] | None]
    block: Mapped[list[Any] | None]
    registers: Mapped[int | None] = mapped_column(Integer)
    static_shared_bytes: Mapped[int | None] = mapped_column(Integer)
    dynamic_shared_bytes: Mapped[int | None] = mapped_column(Integer)
    local_bytes: Mapped[int | None] = mapped_column(Integer)


class Memcpy(Base):
    __tablename__ = "memcpy"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String)
    count: Mapped[int | None] = mapped_column(Integer)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    total_ms: Mapped[float | None] = mapped_column(Float)


class LayerTime(Base):
    """One conv layer of one run: its median op time and its floors (docs/result-format.md), so
    GFLOP/s and floor-based GB/s are plain arithmetic in SQL. Failed runs have no op time. The
    only place op times are stored: the seeds' op time 1 and 2 are layer_index 0 and 1."""

    __tablename__ = "layer_time"
    __table_args__ = (UniqueConstraint("run_id", "layer_index"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    layer: Mapped[str] = mapped_column(String, primary_key=True)
    layer_index: Mapped[int] = mapped_column(Integer)  # 0-based position among the run's conv layers
    variant: Mapped[str | None] = mapped_column(String)  # this layer's variant (runs may mix them)
    op_time_ms: Mapped[float | None] = mapped_column(Float)
    flops: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger)


class Phase(Base):
    """Where one run's wall time went (total_s split: process start, load, compile, allocate,
    warm-up, timed repeats, check, nsys profile/export), from the result's phases_s."""

    __tablename__ = "phase"

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    seconds: Mapped[float | None] = mapped_column(Float)


@dataclass
class IngestReport:
    """What one ingest_files call did: measurements already stored count as unchanged, and each
    file that could not be stored is one line in `errors` (file: what is wrong)."""

    added: int = 0
    unchanged: int = 0
    added_by_status: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


# --- connecting ---------------------------------------------------------------------------


def resolve_url(url: str | None = None) -> URL:
    """The database URL: the argument, else $CONVSWEEP_DB, else db/results.sqlite under the cwd."""
    raw = url or os.environ.get("CONVSWEEP_DB") or DEFAULT_DB_URL
    try:
        sa_url = make_url(raw)
    except ArgumentError:
        hidden = re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", raw)
        raise StoreError(f"bad database URL {hidden!r}: expected e.g. sqlite:///db/results.sqlite "
                         "or postgresql://user@host/db") from None
    if sa_url.drivername == "postgresql":
        # psycopg 3 is the driver we install; SQLAlchemy's default would be psycopg2.
        sa_url = sa_url.set(drivername="postgresql+psycopg")
    return sa_url


def show_url(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def one_line(exc: BaseException, url: URL | None = None) -> str:
    """A driver error as one line, without the password even if the driver echoed it."""
    inner = getattr(exc, "orig", None) or exc
    message = " ".join(str(inner).split()) or type(inner).__name__
    if url is not None and url.password:
        message = message.replace(str(url.password), "***")
    return message


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL, or None for in-memory and non-SQLite databases."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:"):
        return None
    return Path(url.database)


def make_engine(url: URL, *, read_only: bool = False, **kwargs: Any) -> Engine:
    """An engine with our connection settings; bad URLs and missing drivers become StoreError."""
    connect_args = dict(kwargs.pop("connect_args", {}))
    backend = url.get_backend_name()
    if backend == "postgresql":
        connect_args.setdefault("connect_timeout", PG_CONNECT_TIMEOUT_S)
        if read_only:
            connect_args["options"] = "-c default_transaction_read_only=on"
            # Every statement goes through the extended protocol, which takes one statement at a
            # time: no "COMMIT; SET default_transaction_read_only=off; UPDATE ..." in one string.
            connect_args["prepare_threshold"] = 0
    try:
        engine = create_engine(url, connect_args=connect_args, **kwargs)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"bad database URL {show_url(url)}: {one_line(exc)}") from None
    if backend == "sqlite":
        _tune_sqlite(engine, read_only)
    return engine


def _tune_sqlite(engine: Engine, read_only: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # We emit BEGIN ourselves (below): pysqlite's own transaction handling breaks SAVEPOINT
        # and would start write transactions too late to wait politely for other writers.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if read_only:
            # mode=ro in the URL guards the file; query_only also guards anything ATTACHed.
            cursor.execute("PRAGMA query_only=ON")
        else:
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _writer(engine: Engine) -> Engine:
    """The engine whose transactions take SQLite's write lock up front, so concurrent writers queue."""
    return engine.execution_options(sqlite_begin="IMMEDIATE")


def open_store(url: str | None = None) -> Engine:
    """Connect to the result database and bring its schema up to date (Alembic, head).

    Each way a database can be unusable is one StoreUnavailable line: the server is unreachable,
    the file is not an SQLite database, or the schema is newer than this convsweep knows.
    """
    sa_url = resolve_url(url)
    path = sqlite_path(sa_url)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {path.parent} for the database: {exc.strerror}") from None
    engine = make_engine(sa_url)
    try:
        connection = _writer(engine).connect()
    except DBAPIError as exc:
        engine.dispose()
        if path is not None and "not a database" in one_line(exc):
            raise StoreUnavailable(f"{path} is not an SQLite database ({one_line(exc)}): move it aside, or set "
                                   "CONVSWEEP_DB (or db_url) to another database") from None
        raise StoreUnavailable(f"database {show_url(sa_url)} unreachable: {one_line(exc, sa_url)}") from None
    try:
        with connection:
            _migrate(connection, sa_url)
    except StoreError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StoreUnavailable(f"cannot migrate database {show_url(sa_url)}: {one_line(exc, sa_url)}") from None
    return engine


def migrate(engine: Engine, revision: str = "head", *, downgrade: bool = False) -> None:
    """Move the schema to `revision` (up, or down with `downgrade`) in one transaction."""
    with _writer(engine).connect() as connection:
        _migrate(connection, engine.url, revision, downgrade)


def _migrate(connection: Connection, url: URL, revision: str = "head", downgrade: bool = False) -> None:
    """Migrate in one transaction, refusing a database whose revision this code does not know."""
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    head = scripts.get_current_head()
    known = {script.revision for script in scripts.walk_revisions()}
    with _foreign_keys_off(connection), connection.begin():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        current = MigrationContext.configure(connection).get_current_revision()
        if current is not None and current not in known:
            raise StoreUnavailable(f"database {show_url(url)} has schema revision {current!r}, which this convsweep "
                                   f"does not know (its newest is {head!r}): a newer convsweep wrote it; update "
                                   "this checkout or use another database")
        if downgrade:
            command.downgrade(alembic_config(connection), revision)
        elif current != (head if revision == "head" else revision):
            command.upgrade(alembic_config(connection), revision)
        else:
            return
        if connection.dialect.name == "sqlite":
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").first()
            if broken is not None:
                raise StoreUnavailable(f"migrating {show_url(url)} left a row of {broken[0]} without its parent")


@contextmanager
def _foreign_keys_off(connection: Connection) -> Iterator[None]:
    """SQLite migrations rebuild tables (it cannot drop a constraint in place), and with foreign keys
    on, dropping the old table would cascade-delete every child row. The pragma only works between
    transactions, so it goes straight to the driver; PRAGMA foreign_key_check vouches afterwards."""
    if connection.dialect.name != "sqlite":
        yield
        return
    driver = connection.connection.driver_connection
    driver.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        driver.execute("PRAGMA foreign_keys=ON")


def alembic_config(connection: Any) -> Config:
    """The Alembic configuration that migrates this open connection (inside its transaction)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


# --- ingesting ----------------------------------------------------------------------------


def build_key(build: dict[str, Any]) -> str:
    return canonical_hash({k: build.get(k) for k in ("variant", "params", "arch", "options_hash", "source_hash")})


def check_result(result: Any, source: str) -> None:
    """Raise StoreError naming the file and key when a result does not match the result schema."""
    try:
        validate(result, "result", source, fill_defaults=False)
    except ConfigError as exc:
        message = str(exc)  # ends with the offending value, which may be a whole section
        raise StoreError(message) from None


def _timestamp(value: str | None, source: str, key: str) -> datetime | None:
    if value is None:
        return None
    try:
        # Python 3.10's fromisoformat does not take the "Z" suffix.
        stamp = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except (TypeError, ValueError):
        raise StoreError(f"{source}: {key}: expected an ISO 8601 time, got {value!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.astimezone(timezone.utc)


def _get_or_create(session: Session, model: type[Base], keys: dict[str, Any], values: dict[str, Any]) -> int:
    """The id of the row with these key columns, inserted if missing; safe against concurrent inserts."""
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
    return session.scalar(select(model.id).filter_by(**keys))


class _AlreadyStored(Exception):
    """Internal: the measurement is in the database already; roll back and report unchanged."""


def measurement_id(result: dict[str, Any]) -> str:
    """What names one measurement: its own id, or for format 1 (one measurement per job) the run_key."""
    return result["run_key"] if result["format"] == 1 else result["measurement_id"]


def ingest_result(engine: Engine, result: dict[str, Any], result_path: str | None = None) -> bool:
    """Store one result in one transaction; False (and nothing written) when that measurement is
    stored already. A new measurement of a stored job is a new row beside the old ones."""
    source = result_path or f"result {result.get('job_id', '?') if isinstance(result, dict) else '?'}"
    check_result(result, source)
    key = measurement_id(result)
    try:
        with Session(_writer(engine)) as session, session.begin():
            if session.scalar(select(Run.id).where(Run.measurement_id == key)) is not None:
                raise _AlreadyStored
            session.add(_run_row(session, result, result_path, source))
        return True
    except _AlreadyStored:
        return False
    except IntegrityError as exc:
        # Another process may have stored the same measurement between our check and our insert.
        with Session(engine) as session:
            if session.scalar(select(Run.id).where(Run.measurement_id == key)) is not None:
                return False
        raise StoreError(f"cannot store {source}: {one_line(exc)}") from None
    except OperationalError as exc:  # the server went away, a lock timed out: not this file's fault
        raise StoreUnavailable(f"cannot store {source}: {one_line(exc)}") from None
    except DBAPIError as exc:
        raise StoreError(f"cannot store {source}: {one_line(exc)}") from None


def conv_layers(variants: dict[str, Any], floors: dict[str, Any], op_time_ms: dict[str, Any]) -> list[str]:
    """The run's conv layers in layer_index order: those of spec.variants in network order, then
    any other layer that only its op times or floors name."""
    layers = list(variants)
    for layer in [*op_time_ms, *floors]:
        if layer not in layers:
            layers.append(layer)
    return layers


def _run_row(session: Session, result: dict[str, Any], result_path: str | None, source: str) -> Run:
    spec = result["spec"]
    sweep = result["sweep"]
    env = result["environment"]
    timings = result.get("timings") or {}
    images = result.get("images") or {}
    op_time_ms = timings.get("op_time_ms") or {}
    dataset = spec.get("dataset")
    now = datetime.now(timezone.utc)

    sweep_id = _get_or_create(
        session, Sweep,
        {"experiment": sweep["experiment"], "config_hash": sweep["config_hash"]},
        {"config_path": sweep.get("config_path"), "created_at": now},
    )
    environment_id = _get_or_create(
        session, Environment,
        {"env_hash": canonical_hash(env)},
        {k: env.get(k) for k in ("hostname", "gpu", "gpu_uuid", "compute_capability", "driver", "cuda_driver",
                                 "nvrtc", "nsys", "python", "packages")},
    )
    git = result.get("git") or {"commit": env.get("git_commit"), "dirty": None}  # format 1 kept it there
    clocks = result.get("clocks") or {}
    sources = result.get("sources") or None
    # A build keeps the compile_ms and cache_hit of the run that first stored it; each run's own
    # compile time is run.compile_ms.
    build_ids = {
        _get_or_create(
            session, Build,
            {"build_key": build_key(build)},
            {k: build.get(k) for k in ("variant", "params", "arch", "options_hash", "source_hash",
                                       "compile_ms", "cache_hit", "log", "kernels")},
        )
        for build in result.get("builds") or []
    }

    run = Run(
        measurement_id=measurement_id(result),
        run_key=result["run_key"],
        job_id=result["job_id"],
        sweep_id=sweep_id,
        environment_id=environment_id,
        experiment=spec["experiment"],
        network=spec["network"],
        dataset=dataset["name"] if isinstance(dataset, dict) else dataset,  # IDX files: their name
        variants=spec["variants"],
        params=spec.get("params"),
        variant=variant_label(spec["variants"]),
        batch=spec["batch"],
        streams=spec["streams"],
        host_memory=spec["host_memory"],
        chunk_images=spec.get("chunk_images"),
        repeats=spec.get("repeats"),
        warmup=spec.get("warmup"),
        profiler_requested=spec.get("profiler"),
        profiler=result.get("profiler"),
        status=result["status"],
        error=result.get("error"),
        accuracy=result.get("accuracy"),
        prediction_agreement=result.get("prediction_agreement"),
        max_rel_err=result.get("max_rel_err"),
        tolerance=result.get("tolerance"),
        images_unique=images.get("unique"),
        cycled=images.get("cycled"),
        h2d_ms=timings.get("h2d_ms"),
        d2h_ms=timings.get("d2h_ms"),
        compute_ms=timings.get("compute_ms"),
        forward_ms=timings.get("forward_ms"),
        overlap=timings.get("overlap"),
        total_s=timings.get("total_s"),
        compile_ms=timings.get("compile_ms"),
        phases=result.get("phases_s"),
        floors=result.get("floors"),
        files=result.get("files"),
        started_at=_timestamp(result.get("started_at"), source, "started_at"),
        ingested_at=now,
        result_path=result_path,
        source_hash=canonical_hash(sources) if sources else None,
        sources=sources,
        git_commit=git.get("commit"),
        git_dirty=git.get("dirty"),
        sm_clock_mhz=clocks.get("sm_mhz"),
        memory_clock_mhz=clocks.get("memory_mhz"),
    )
    run.builds = [session.get(Build, build_id) for build_id in sorted(build_ids)]
    run.samples = [
        Sample(metric=s.get("metric"), layer=s.get("layer"), repeat=s.get("repeat"), value=s.get("value"))
        for s in result.get("samples") or []
    ]
    run.kernels = [
        KernelStat(**{k: kernel.get(k) for k in (
            "layer", "name", "launches", "total_ms", "median_ms", "grid", "block", "registers",
            "static_shared_bytes", "dynamic_shared_bytes", "local_bytes")})
        for kernel in result.get("kernels") or []
    ]
    run.memcpys = [
        Memcpy(kind=m.get("kind"), count=m.get("count"), bytes=m.get("bytes"), total_ms=m.get("total_ms"))
        for m in result.get("memcpys") or []
    ]
    floors = result.get("floors") or {}
    run.layer_times = [
        LayerTime(layer_index=index, layer=layer, variant=spec["variants"].get(layer), op_time_ms=op_time_ms.get(layer),
                  flops=(floors.get(layer) or {}).get("flops"), bytes=(floors.get(layer) or {}).get("bytes"))
        for index, layer in enumerate(conv_layers(spec["variants"], floors, op_time_ms))
    ]
    run.phase_times = [Phase(name=name, seconds=seconds) for name, seconds in (result.get("phases_s") or {}).items()]
    return run


def read_result(path: str | Path) -> dict[str, Any]:
    """One result file, parsed; unreadable or non-JSON files raise StoreError naming the file."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path}: not valid JSON: {exc}") from None


def ingest_files(engine: Engine, paths: Iterable[str | Path]) -> IngestReport:
    """Ingest result files one transaction each. A file that cannot be read or stored becomes one
    line of the report's errors and the others go on; a lost database connection stops it all."""
    report = IngestReport()
    for path in paths:
        try:
            result = read_result(path)
            stored = ingest_result(engine, result, str(path))
        except StoreUnavailable:
            raise
        except StoreError as exc:
            report.errors.append(str(exc))
            continue
        if stored:
            report.added += 1
            report.added_by_status[result["status"]] += 1
        else:
            report.unchanged += 1
    return report
