"""Opening a result store: URLs, engines tuned for SQLite (WAL, busy timeout) and PostgreSQL,
reachability in one line, and the Alembic migrations every opening runs to head."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError, SQLAlchemyError

from convsweep.base.errors import StoreError, StoreUnavailable
from convsweep.base.paths import DEFAULT_DB_URL, MIGRATIONS_DIR

if TYPE_CHECKING:
    from alembic.config import Config

# The newest migration in db/migrations/versions, read from the files' names (NNNN_what.py, each
# file's revision its number; a test ties the two), so a migration is one new file: a database
# already there is opened without importing Alembic, ~0.45 s of every ingest, report and sweep start
# on the lent GPU's host.
SCHEMA_REVISION = max(path.name[:4] for path in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))

PG_CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Serializes concurrent migrations on one PostgreSQL database (any constant, unique to us).
_PG_MIGRATION_LOCK = 0x636F6E76



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


@contextmanager
def storing(source: str) -> Iterator[None]:
    """Database errors while storing `source`, as convsweep's: a server gone or a lock that timed out
    is StoreUnavailable (not the file's fault: the rest can wait), anything else a StoreError
    naming the file."""
    try:
        yield
    except OperationalError as exc:
        raise StoreUnavailable(f"cannot store {source}: {one_line(exc)}") from None
    except DBAPIError as exc:
        raise StoreError(f"cannot store {source}: {one_line(exc)}") from None


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
    except ImportError as exc:
        if url.get_driver_name() == "psycopg":  # the driver resolve_url picks, which the postgres extra installs
            raise StoreError(f"{show_url(url)} needs the PostgreSQL driver psycopg, which the postgres extra installs: "
                             f"pip install -e '.[postgres]' ({one_line(exc)})") from None
        raise StoreError(f"bad database URL {show_url(url)}: {one_line(exc)}") from None
    except (ArgumentError, NoSuchModuleError) as exc:
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
    the file is not an SQLite database or cannot be written, or the schema is newer than this
    convsweep knows.
    """
    sa_url = resolve_url(url)
    path = sqlite_path(sa_url)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {path.parent} for the database: {exc.strerror}") from None
        _refuse_unwritable(path)
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
            if sa_url.get_backend_name() == "sqlite":
                _refuse_read_only_connection(connection, str(path or show_url(sa_url)))
    except StoreError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StoreUnavailable(f"cannot migrate database {show_url(sa_url)}: {one_line(exc, sa_url)}") from None
    return engine


_UNSTORED = "a sweep could not store its results"


def _refuse_unwritable(path: Path) -> None:
    """StoreUnavailable unless the SQLite file (if there) and its directory can be written: SQLite
    opens a file it may not write read-only without a word, and creates its -wal and -shm files
    beside it, so either would fail only when the first job's results are stored."""
    if path.exists() and (why := _why_unwritable(path)):
        raise StoreUnavailable(f"{path}: {why}: {_UNSTORED}")
    if why := _why_unwritable(path.parent):
        files = f"{path.name}-wal and -shm" if path.exists() else f"{path.name} and its -wal and -shm"
        raise StoreUnavailable(f"{path.parent}: directory {why}: SQLite creates {files} there, so {_UNSTORED}")


def _why_unwritable(path: Path) -> str | None:
    """Why this user cannot write `path` (a file, or files into a directory), or None."""
    status = path.stat()
    mode = stat.S_IMODE(status.st_mode)
    if hasattr(os, "statvfs") and os.statvfs(path).f_flag & os.ST_RDONLY:
        return "on a read-only file system"
    # Without any write bit it was marked read-only on purpose: refused even for root, whom
    # os.access lets write anything (sweeps in containers often run as root).
    if not mode & 0o222:
        return f"read-only (mode {mode:04o})"
    if not os.access(path, os.W_OK | (os.X_OK if stat.S_ISDIR(status.st_mode) else 0)):
        return f"not writable by this user (mode {mode:04o}, owner {_user_name(status.st_uid)})"
    return None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _refuse_read_only_connection(connection: Connection, name: str) -> None:
    """Write nothing in a transaction that is rolled back: SQLite refuses it on a connection it
    opened read-only (a mode=ro URI, or a file that the checks before could not tell)."""
    try:
        with connection.begin() as transaction:
            connection.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
            transaction.rollback()
    except DBAPIError as exc:
        raise StoreUnavailable(f"{name}: cannot write ({one_line(exc)}): {_UNSTORED}") from None


def migrate(engine: Engine, revision: str = "head", *, downgrade: bool = False) -> None:
    """Move the schema to `revision` (up, or down with `downgrade`) in one transaction."""
    with _writer(engine).connect() as connection:
        _migrate(connection, engine.url, revision, downgrade)


def bring_up_to_date(reader: Engine, url: str | URL) -> str | None:
    """Before a read-only engine reads: a database of an older schema (made by an older convsweep, say) is
    migrated first, as a sweep or ingest would on opening it, since the queries are written for this schema's
    views. Where it cannot be (the file is read-only, the role may not), what to do, for the read's error to
    add should the old views not answer it; None where the schema is current or the read will say what is wrong."""
    try:
        with reader.connect() as connection:
            stored = _stored_revision(connection)
    except SQLAlchemyError:  # unreachable, or a role that may not read alembic_version: the read itself says so
        return None
    if stored is None or stored >= SCHEMA_REVISION:
        return None
    try:
        open_store(url.render_as_string(hide_password=False) if isinstance(url, URL) else url).dispose()
    except StoreError as exc:
        return (f"the database is at schema {stored} and this convsweep's queries read {SCHEMA_REVISION}'s "
                f"views, but it could not be migrated ({exc}): open it once where it can be written "
                f"(`convsweep ingest`, or the next `snakemake`)")
    return None


def _stored_revision(connection: Connection) -> str | None:
    """The database's Alembic revision, read with plain SQL; None for a database without one."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _migrate(connection: Connection, url: URL, revision: str = "head", downgrade: bool = False) -> None:
    """Migrate in one transaction, refusing a database whose revision this code does not know."""
    if not downgrade and revision in ("head", SCHEMA_REVISION):
        up_to_date = _stored_revision(connection) == SCHEMA_REVISION
        connection.rollback()  # end the read's transaction; migrating opens its own
        if up_to_date:
            return
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

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
    assert driver is not None  # an open connection's
    driver.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        driver.execute("PRAGMA foreign_keys=ON")


def alembic_config(connection: Any) -> Config:
    """The Alembic configuration that migrates this open connection (inside its transaction)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config
