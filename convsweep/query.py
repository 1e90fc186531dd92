"""Ad-hoc and named SQL over the result store, on a connection that cannot write, within a time limit
and a row cap.

Read-only in depth: one statement, and it must be a question (SELECT, WITH, VALUES, TABLE,
EXPLAIN, SHOW; PRAGMA on SQLite). SQLite opens the file with mode=ro and query_only, and an
authorizer allows reads alone (no ATTACH, which would create a file; no pragma that writes; no
extension loading). PostgreSQL runs it in a READ ONLY transaction, and refuses a role that could step
out of one (a superuser sets the role back with set_config(), a member of pg_read_server_files reads the
server's files): a typed question needs a plain role, e.g. one granted pg_read_all_data.

Bounded: SQLite's progress handler interrupts a statement past its deadline; PostgreSQL's server stops it
itself (statement_timeout, idle_in_transaction_session_timeout), so a killed client leaves no backend
running, and a server-side cursor hands over at most max_rows + 1 rows, so a huge result never
materializes. The project's own queries (reports, figures, compare) read every row without a limit.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool
from tabulate import tabulate

from convsweep.errors import StoreError
from convsweep.paths import QUERIES_DIR
from convsweep.store import make_engine, one_line, resolve_url, show_url, sqlite_path

FORMATS = ("table", "csv", "json")
# A typed question's bounds, Datasette's kind of limits with room for a sweep's tables: every named query answers
# a full sweep in well under a second.
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_ROWS = 10_000
TABLE_SIGNIFICANT_DIGITS = 4
_QUERY_NAME = re.compile(r"[A-Za-z0-9_-]+")
_PG_REFUSALS = {"25006", "42501"}  # SQLSTATE read_only_sql_transaction, insufficient_privilege
_PG_QUERY_CANCELED = "57014"  # what statement_timeout raises
_PG_MAX_TIMEOUT_MS = 2**31 - 1  # PostgreSQL's timeouts are 32-bit milliseconds
# The statements DECLARE ... CURSOR takes: the others (EXPLAIN, SHOW) answer in a few rows anyway.
_PG_CURSOR_QUESTIONS = {"SELECT", "WITH", "VALUES", "TABLE"}
# SQLite virtual-machine steps between two looks at the clock: about a millisecond's work.
_SQLITE_PROGRESS_STEPS = 10_000
QUESTIONS = ("SELECT", "WITH", "VALUES", "TABLE", "EXPLAIN", "SHOW")
_SQLITE_QUESTIONS = QUESTIONS + ("PRAGMA",)
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/|\()*", re.S)
# Pragmas that only describe the schema, and pragmas that only read a setting when given no value.
_SQLITE_SCHEMA_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
                          "foreign_key_list", "collation_list", "function_list", "pragma_list", "module_list",
                          "database_list", "compile_options"}
_SQLITE_SETTING_PRAGMAS = {"user_version", "schema_version", "application_id", "page_count", "page_size",
                           "freelist_count", "journal_mode", "foreign_keys", "query_only", "encoding", "data_version"}
_SQLITE_READS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE, sqlite3.SQLITE_TRANSACTION}
_SQLITE_BANNED_FUNCTIONS = {"load_extension", "fts3_tokenizer"}
# Roles whose members read, write or execute on the server's file system.
_PG_FILE_ROLES = ("pg_read_server_files", "pg_write_server_files", "pg_execute_server_program")


def list_queries() -> list[tuple[str, str]]:
    """(name, question it answers) of every db/queries/*.sql, by name."""
    found = []
    for path in sorted(QUERIES_DIR.glob("*.sql")):
        first = path.read_text(encoding="utf-8").split("\n", 1)[0].strip()
        found.append((path.stem, first[2:].strip() if first.startswith("--") else ""))
    return found


def is_query_name(text: str) -> bool:
    """Whether `text` reads as a query's name rather than SQL."""
    return bool(_QUERY_NAME.fullmatch(text.strip()))


def resolve_sql(sql_or_name: str) -> str:
    """The text of a named query or of a .sql file, or the argument itself when it is SQL."""
    candidate = sql_or_name.strip()
    if candidate.endswith(".sql") and Path(candidate).is_file():
        return Path(candidate).read_text(encoding="utf-8")
    if _QUERY_NAME.fullmatch(candidate):
        path = QUERIES_DIR / f"{candidate}.sql"
        if path.is_file():
            return path.read_text(encoding="utf-8")
        known = ", ".join(name for name, _ in list_queries())
        raise StoreError(f"no query named {candidate!r} in {QUERIES_DIR} (known: {known})")
    return sql_or_name


def run_query(url: str | None, sql_or_name: str, fmt: str = "table", params: dict[str, Any] | None = None,
              timeout_s: float | None = DEFAULT_TIMEOUT_S, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Run a named query or SQL read-only within the bounds and render it as a Markdown table, CSV or JSON. A result
    cut at max_rows says so under the table, or on stderr for CSV and JSON, whose parsers a line would break."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown output format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return present(fetch(url, sql_or_name, params, timeout_s=timeout_s, max_rows=max_rows), fmt, max_rows)


def present(answer: "Answer", fmt: str, max_rows: int | None) -> str:
    """An answer rendered as `fmt`, saying where it was cut at max_rows."""
    columns, rows, truncated = answer
    rendered = render(columns, rows, fmt)
    if truncated:
        note = f"first {max_rows} row{'s' * (max_rows != 1)}; --max-rows to change"
        if fmt != "table":
            print(note, file=sys.stderr)
            return rendered
        rendered += f"\n\n{note}"
    return rendered


class Answer(NamedTuple):
    """A question's column names and rows; `truncated` when it had more rows than it was allowed."""

    columns: list[str]
    rows: list[Sequence[Any]]
    truncated: bool = False


def fetch(url: str | None, sql_or_name: str, params: dict[str, Any] | None = None,
          timeout_s: float | None = DEFAULT_TIMEOUT_S, max_rows: int | None = DEFAULT_MAX_ROWS) -> Answer:
    """A typed question (SQL or a named query) run read-only, stopped past timeout_s and cut after max_rows (None:
    no bound); on PostgreSQL a role that could step out of read-only is refused."""
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise StoreError(f"--timeout must be a number of seconds above 0, got {timeout_s}")
    if max_rows is not None and max_rows < 1:
        raise StoreError(f"--max-rows must be 1 or more, got {max_rows}")
    return _run(url, sql_or_name, params, _Bounds(timeout_s, max_rows, typed=True))


def fetch_dicts(url: str | None, sql_or_name: str, params: dict[str, Any] | None = None
                ) -> tuple[list[str], list[dict[str, Any]]]:
    """Every row of one of the project's own queries (reports, figures, compare) as a dict by column name: no time
    limit or row cap, which would cut a large sweep short without a word, and any role that may read."""
    columns, rows, _ = _run(url, sql_or_name, params, _Bounds(None, None, typed=False))
    return columns, [dict(zip(columns, row)) for row in rows]


def _run(url: str | None, sql_or_name: str, params: dict[str, Any] | None, bounds: _Bounds) -> Answer:
    sql = resolve_sql(sql_or_name)
    sa_url = resolve_url(url)
    keyword = _check_question(sql, _SQLITE_QUESTIONS if sa_url.get_backend_name() == "sqlite" else QUESTIONS)
    engine = _read_only_engine(sa_url, bounds.timeout_s)
    try:
        return _fetch(engine, sa_url, sql, params or {}, keyword, bounds)
    finally:
        engine.dispose()


def _read_only_engine(url: URL, timeout_s: float | None = None) -> Engine:
    path = sqlite_path(url)
    if path is not None:
        if not path.is_file():
            raise StoreError(f"no database at {path}: run a sweep first")
        url = URL.create("sqlite", database=f"file:{quote(str(path.resolve()))}",
                         query={"mode": "ro", "uri": "true"})
    elif url.get_backend_name() == "sqlite":
        raise StoreError(f"cannot open {show_url(url)} read-only: give a SQLite file or a server URL")
    engine = make_engine(url, read_only=True, poolclass=NullPool)
    if path is not None:
        event.listen(engine, "connect", _authorize_reads_only)  # after make_engine's own pragmas
    elif timeout_s is not None:
        # Session settings from the start, not SET LOCAL: an error rolls a transaction's settings back, and the
        # backend of a client that stopped after one (a timed-out statement) would then wait forever.
        timeout_ms = _pg_milliseconds(timeout_s)
        limits = f"-c statement_timeout={timeout_ms} -c idle_in_transaction_session_timeout={timeout_ms}"

        @event.listens_for(engine, "do_connect")
        def _with_limits(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
            cparams["options"] = f"{cparams.get('options', '')} {limits}".strip()
    return engine


def _check_question(sql: str, allowed: tuple[str, ...]) -> str:
    """The statement's keyword, if it is one of the kinds that ask (a write fails anyway; this also stops DO blocks
    and SET ROLE, which a superuser's session could otherwise use)."""
    body = _LEADING_NOISE.sub("", sql, count=1)
    keyword = (re.match(r"[A-Za-z]+", body) or [""])[0].upper()
    if keyword not in allowed:
        raise StoreError(f"read-only connection: convsweep query runs one {', '.join(allowed)} statement, "
                         f"got {keyword or repr(sql.strip()[:20])}")
    return keyword


def _authorize_reads_only(dbapi_connection: Any, record: Any) -> None:
    """An SQLite authorizer that lets a statement read and nothing else; what it refused is kept in
    the connection's info for the error message."""
    refused: list[str] = record.info.setdefault("refused", [])

    def authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
        if action in _SQLITE_READS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in _SQLITE_BANNED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in _SQLITE_SCHEMA_PRAGMAS or (name in _SQLITE_SETTING_PRAGMAS and arg2 is None):
                return sqlite3.SQLITE_OK
            refused.append(f"PRAGMA {name}" + (f" = {arg2}" if arg2 is not None else ""))
        elif action == sqlite3.SQLITE_FUNCTION:
            refused.append(f"the function {arg2}()")
        elif action == sqlite3.SQLITE_ATTACH:
            refused.append(f"ATTACH of {arg1!r}")
        else:
            refused.append(_SQLITE_ACTIONS.get(action, f"action {action}") + (f" on {arg1}" if arg1 else ""))
        return sqlite3.SQLITE_DENY

    dbapi_connection.set_authorizer(authorize)


# The authorizer's action codes by name (listed: sqlite3's result codes reuse the same numbers).
_SQLITE_ACTIONS = {getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ").lower() for name in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
    "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX",
    "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "UPDATE",
    "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "SAVEPOINT")}


@dataclass
class _Bounds:
    """How far one query may go: its time (None: no limit) from when it starts, its rows, and whether the SQL was
    typed by someone (then PostgreSQL refuses a role that could step out of read-only)."""

    timeout_s: float | None
    max_rows: int | None
    typed: bool
    deadline: float | None = None
    passed: bool = False  # the deadline stopped the query, whatever error the driver made of that

    def start(self, connection: Any) -> None:
        """Start the clock; on SQLite a progress handler interrupts the statement once it runs past the deadline."""
        if self.timeout_s is None:
            return
        self.deadline = time.monotonic() + self.timeout_s
        if connection.dialect.name == "sqlite":
            def past_deadline() -> bool:
                self.passed = time.monotonic() > self.deadline
                return self.passed

            connection.connection.driver_connection.set_progress_handler(past_deadline, _SQLITE_PROGRESS_STEPS)

    def limit_next_statement(self, connection: Any) -> None:
        """On PostgreSQL the server stops the next statement at the query's deadline (the session's own
        statement_timeout counts from each statement), so a client killed meanwhile leaves nothing running."""
        if self.deadline is None or connection.dialect.name != "postgresql":
            return
        remaining_s = self.deadline - time.monotonic()
        if remaining_s <= 0:
            self.passed = True
            raise StoreError(self.stopped())
        connection.exec_driver_sql(f"SET LOCAL statement_timeout = {_pg_milliseconds(remaining_s)}")

    def stopped(self) -> str:
        return f"query stopped after {self.timeout_s:g} s (--timeout to change)"


def _fetch(engine: Engine, url: URL, sql: str, params: dict[str, Any], keyword: str, bounds: _Bounds) -> Answer:
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        raise StoreError(f"database {show_url(url)} unreachable: {one_line(exc, url)}") from None
    with connection:
        try:
            with connection.begin() as transaction:
                if connection.dialect.name == "postgresql":
                    connection.exec_driver_sql("SET TRANSACTION READ ONLY")
                    if bounds.typed:
                        _refuse_roles_beyond_read_only(connection)
                    if bounds.timeout_s is not None:
                        _notice_a_lost_client(connection)
                bounds.start(connection)
                answer = _answer(connection, sql, params, keyword, bounds)
                transaction.rollback()
        except DBAPIError as exc:
            if bounds.passed or (bounds.timeout_s is not None
                                 and getattr(exc.orig, "sqlstate", None) == _PG_QUERY_CANCELED):
                raise StoreError(bounds.stopped()) from None
            refused = connection.info.get("refused")
            if refused:  # the first thing refused, not what it led to
                raise StoreError(f"read-only connection: {refused[0]} is not allowed") from None
            if _is_write_refused(exc):
                raise StoreError(f"read-only connection: {one_line(exc, url)}") from None
            raise StoreError(f"query failed: {one_line(exc, url)}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"query failed: {one_line(exc, url)}") from None
    return answer


def _answer(connection: Any, sql: str, params: dict[str, Any], keyword: str, bounds: _Bounds) -> Answer:
    """The statement's columns and rows, at most max_rows of them (one more is read to tell that there were more)."""
    options = {}
    if bounds.max_rows is not None and connection.dialect.name == "postgresql" and keyword in _PG_CURSOR_QUESTIONS:
        # A server-side cursor, whose one FETCH reads max_rows + 1 rows: the server never builds the whole result.
        options = {"yield_per": bounds.max_rows + 1}
    bounds.limit_next_statement(connection)
    result = connection.execute(text(sql), params, execution_options=options)
    if not result.returns_rows:
        return Answer([], [])
    columns = list(result.keys())
    bounds.limit_next_statement(connection)  # a cursor's FETCH runs the rest of the query: only the time left
    rows = result.fetchall() if bounds.max_rows is None else result.fetchmany(bounds.max_rows + 1)
    result.close()
    if bounds.max_rows is not None and len(rows) > bounds.max_rows:
        return Answer(columns, rows[:bounds.max_rows], truncated=True)
    return Answer(columns, rows)


def _refuse_roles_beyond_read_only(connection: Any) -> None:
    """Refuse a session that is, or may become, a role which steps out of a read-only query: a superuser
    (set_config('role', ...) inside one SELECT, then any function) or a member of a role reaching the server's files."""
    file_roles = ", ".join(f"'{role}'" for role in _PG_FILE_ROLES)
    session_role, superuser, members_of = connection.exec_driver_sql(
        f"SELECT session_user, r.rolsuper, ARRAY(SELECT p.rolname FROM pg_roles p WHERE (p.rolsuper OR p.rolname IN "
        f"({file_roles})) AND pg_has_role(session_user, p.oid, 'MEMBER') ORDER BY p.rolname) "
        "FROM pg_roles r WHERE r.rolname = session_user").one()
    if not superuser and not members_of:
        return
    what = "is a superuser" if superuser else f"is a member of {', '.join(members_of)}"
    raise StoreError(f"read-only connection: role {session_role} {what}, which can step out of a read-only query; "
                     "connect as a plain role: CREATE ROLE reader LOGIN; GRANT pg_read_all_data TO reader")


def _notice_a_lost_client(connection: Any) -> None:
    """From PostgreSQL 14 a running query looks for its client every second, so a killed client's query ends then
    rather than at the deadline (earlier servers lack the setting: skipped)."""
    connection.exec_driver_sql("SELECT set_config(name, '1s', true) FROM pg_settings "
                               "WHERE name = 'client_connection_check_interval'")


def _pg_milliseconds(seconds: float) -> int:
    return min(math.ceil(seconds * 1000), _PG_MAX_TIMEOUT_MS)


def _is_write_refused(exc: DBAPIError) -> bool:
    if getattr(exc.orig, "sqlstate", None) in _PG_REFUSALS:
        return True
    return "readonly database" in str(exc.orig)


def render(columns: list[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Rows as a GitHub-Markdown table, CSV with a header, or a JSON list of objects."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else _json_text(_plain(v)) for v in row] for row in rows])
        return out.getvalue()
    if fmt == "json":
        return json.dumps([{c: _plain(v) for c, v in zip(columns, row)} for row in rows], indent=2)
    numeric = [all(v is None or _is_number(v) for v in column) for column in zip(*rows)] or [False] * len(columns)
    cells = [[_cell(v) for v in row] for row in rows]
    return tabulate(cells, headers=columns, tablefmt="github", disable_numparse=True,
                    colalign=["right" if n else "left" for n in numeric])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    """A value JSON and CSV can carry as is."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    return value


def _json_text(value: Any) -> Any:
    """JSON objects and lists as their JSON text, `{"BLOCK": 64}`: PostgreSQL hands JSON columns
    back as Python objects (SQLite as that text), and their repr is no JSON."""
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _cell(value: Any) -> str:
    """A table cell: floats to a few significant digits, positional where that stays short."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        value = _plain(value)
    if not isinstance(value, float):
        return str(_json_text(_plain(value)))
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = math.floor(math.log10(abs(value)))
    if -4 <= magnitude < 6:
        return f"{value:.{max(0, TABLE_SIGNIFICANT_DIGITS - 1 - magnitude)}f}"
    return f"{value:.{TABLE_SIGNIFICANT_DIGITS - 1}e}"
