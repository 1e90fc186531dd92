"""Ad-hoc and named SQL over the result store, on a connection that cannot write, within a time limit,
a row cap and a cap in bytes.

Read-only in depth: one statement, and it must be a question (SELECT, WITH, VALUES, TABLE,
EXPLAIN, SHOW; PRAGMA on SQLite). SQLite opens the file with mode=ro and query_only, and an
authorizer allows reads alone (no ATTACH, which would create a file; no pragma that writes; no
extension loading). PostgreSQL runs it in a READ ONLY transaction, and refuses a role that could step
out of one (a superuser sets the role back with set_config(), a member of pg_read_server_files reads the
server's files): a typed question needs a plain role, e.g. one granted pg_read_all_data.

Bounded: SQLite's progress handler interrupts a statement past its deadline; PostgreSQL's server stops it
itself (statement_timeout, idle_in_transaction_session_timeout), so a killed client leaves no backend
running. Rows arrive one at a time (PostgreSQL's single-row mode), so reading stops after max_rows + 1 of them
and a huge result never materializes.

Bounded in bytes, since a few rows of large values pass any row cap: the rows' sizes add up as they arrive and
the query stops past max_bytes, and no value larger than max_cell_bytes (less in a wide row, whose values share
max_bytes) is ever built. SQLite enforces that itself (SQLITE_LIMIT_LENGTH: a larger string or blob, stored or
computed, fails the statement); PostgreSQL gets the question as a subquery whose every value is measured in SQL
(octet_length, which reads a stored text's size without reading the text) and withheld when too large. What is
not a subquery (EXPLAIN, SHOW, PRAGMA) is measured as it arrives. The project's own queries (reports, figures,
compare) read every row without a limit.
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
from collections.abc import Generator, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple, cast
from urllib.parse import quote

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool
from tabulate import tabulate

from convsweep.base import axes
from convsweep.base.errors import StoreError
from convsweep.base.numbers import short
from convsweep.base.paths import QUERIES_DIR
from convsweep.store import bring_up_to_date, make_engine, one_line, resolve_url, show_url, sqlite_path

FORMATS = ("table", "csv", "json")
# A typed question's bounds, Datasette's kind of limits with room for a sweep's tables: every named query answers
# a full sweep in well under a second.
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_ROWS = 10_000
# ... and its bytes: what a terminal or a pipe takes at once, and a value as large as a long build log. Eight rows of
# 400 MB each are well under the row cap.
DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_MAX_CELL_BYTES = 8 * 2**20
# A Markdown table pads every cell to its column's widest, which copies one long value into every row: a table that
# padding would take past this many characters and more than double is written unpadded (it renders the same).
TABLE_PADDING_MAX_CHARS = 4 * 2**20
TABLE_SIGNIFICANT_DIGITS = 4
_QUERY_NAME = re.compile(r"[A-Za-z0-9_-]+")
# What a query file may write for the cell (convsweep.base.axes), expanded before it runs: {cell} (the axes' columns),
# {cell_order} (an ORDER BY over them, NULLs first on both databases), either qualified ({r.cell}) and either with
# axes left out ({cell except streams}, {r.cell_order except cache, timer}): a query never lists the axes itself.
_CELL_PLACEHOLDER = re.compile(r"\{(?:(\w+)\.)?(cell|cell_order)(?:\s+except\s+(\w+(?:\s*,\s*\w+)*))?\}")
_PG_REFUSALS = {"25006", "42501"}  # SQLSTATE read_only_sql_transaction, insufficient_privilege
_PG_QUERY_CANCELED = "57014"  # what statement_timeout raises
_PG_MAX_TIMEOUT_MS = 2**31 - 1  # PostgreSQL's timeouts are 32-bit milliseconds
# The statements that stand as a subquery, whose values are measured in SQL: the others (EXPLAIN, SHOW, PRAGMA)
# answer in a few short rows.
_SUBQUERY_QUESTIONS = {"SELECT", "WITH", "VALUES", "TABLE"}
# bytea, text, bpchar, varchar: octet_length gives their size from a stored value's header; any other type is
# measured as its text.
_PG_MEASURED_AS_IS = {17, 25, 1042, 1043}
# Rows, each with its size in bytes as the caps count it.
_SizedRows = Generator[tuple[Sequence[Any], int], None, None]
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
    """The text of a named query or of a .sql file, its cell placeholders expanded (expand_cell), or the argument
    itself when it is SQL."""
    candidate = sql_or_name.strip()
    if candidate.endswith(".sql") and Path(candidate).is_file():
        return expand_cell(Path(candidate).read_text(encoding="utf-8"), candidate)
    if _QUERY_NAME.fullmatch(candidate):
        path = QUERIES_DIR / f"{candidate}.sql"
        if path.is_file():
            return expand_cell(path.read_text(encoding="utf-8"), str(path))
        known = ", ".join(name for name, _ in list_queries())
        raise StoreError(f"no query named {candidate!r} in {QUERIES_DIR} (known: {known})")
    return sql_or_name


def expand_cell(sql: str, source: str = "query") -> str:
    """A query file's text with each {cell} and {cell_order} placeholder written out from the axes: `{r.cell}`
    becomes 'r.batch, r.streams, ...', `{cell_order except cache}` the ORDER BY over the others."""
    def written_out(match: re.Match[str]) -> str:
        alias, what, left_out = match.groups()
        names = tuple(name.strip() for name in left_out.split(",")) if left_out else ()
        try:
            return (axes.columns if what == "cell" else axes.order_by)(alias or "", names)
        except ValueError as exc:
            raise StoreError(f"{source}: {match.group(0)}: {exc}") from None

    return _CELL_PLACEHOLDER.sub(written_out, sql)


def run_query(url: str | None, sql_or_name: str, fmt: str = "table", params: dict[str, Any] | None = None,
              timeout_s: float | None = DEFAULT_TIMEOUT_S, max_rows: int | None = DEFAULT_MAX_ROWS,
              max_bytes: int | None = DEFAULT_MAX_BYTES, max_cell_bytes: int | None = DEFAULT_MAX_CELL_BYTES) -> str:
    """Run a named query or SQL read-only within the bounds and render it as a Markdown table, CSV or JSON. A result
    cut at max_rows says so under the table, or on stderr for CSV and JSON, whose parsers a line would break."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown output format {fmt!r}: expected one of {', '.join(FORMATS)}")
    answer = fetch(url, sql_or_name, params, timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes,
                   max_cell_bytes=max_cell_bytes)
    return present(answer, fmt, max_rows)


def present(answer: Answer, fmt: str, max_rows: int | None) -> str:
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
          timeout_s: float | None = DEFAULT_TIMEOUT_S, max_rows: int | None = DEFAULT_MAX_ROWS,
          max_bytes: int | None = DEFAULT_MAX_BYTES, max_cell_bytes: int | None = DEFAULT_MAX_CELL_BYTES) -> Answer:
    """A typed question (SQL or a named query) run read-only, stopped past timeout_s, past max_bytes of values or at
    a value over max_cell_bytes, and cut after max_rows (None: no bound); on PostgreSQL a role that could step out
    of read-only is refused."""
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise StoreError(f"--timeout must be a number of seconds above 0, got {timeout_s}")
    for name, cap in (("--max-rows", max_rows), ("max_bytes", max_bytes), ("max_cell_bytes", max_cell_bytes)):
        if cap is not None and cap < 1:
            raise StoreError(f"{name} must be 1 or more, got {cap}")
    return _run(url, sql_or_name, params, _Bounds(timeout_s, max_rows, typed=True, max_bytes=max_bytes,
                                                  max_cell_bytes=max_cell_bytes))


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
        stale = bring_up_to_date(engine, sa_url)
        try:
            return _fetch(engine, sa_url, sql, params or {}, keyword, bounds)
        except StoreError as exc:
            if stale is None:
                raise
            raise StoreError(f"{exc}; {stale}") from None
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
    """How far one query may go: its time (None: no limit) from when it starts, its rows, its bytes, and whether the
    SQL was typed by someone (then PostgreSQL refuses a role that could step out of read-only)."""

    timeout_s: float | None
    max_rows: int | None
    typed: bool
    max_bytes: int | None = None
    max_cell_bytes: int | None = None
    deadline: float | None = None
    passed: bool = False  # the deadline stopped the query, whatever error the driver made of that
    cell_cap: int | None = None  # the most bytes one value may take in this query's rows
    columns: int | None = None  # how many columns share max_bytes, where known before the rows arrive

    def start(self, connection: Any) -> None:
        """Start the clock; on SQLite a progress handler interrupts the statement once it runs past the deadline."""
        if self.timeout_s is None:
            return
        self.deadline = time.monotonic() + self.timeout_s
        if connection.dialect.name == "sqlite":
            def past_deadline() -> bool:
                self.passed = time.monotonic() > cast(float, self.deadline)  # set above
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

    def share_bytes(self, columns: int | None) -> None:
        """Set the cap on one value: max_cell_bytes, and less where the row's columns share max_bytes, so that no
        one row passes it."""
        self.columns = columns
        shared = self.max_bytes // columns if self.max_bytes is not None and columns else None
        caps = [cap for cap in (self.max_cell_bytes, shared) if cap is not None]
        self.cell_cap = max(1, min(caps)) if caps else None

    def value_too_large(self) -> str:
        if (cap := cast(int, self.cell_cap)) == self.max_cell_bytes:  # only a value past a cap is too large
            return f"query stopped: a value passes {_bytes(cap)}, the cap on one value (leave out its column)"
        return (f"query stopped: a value passes {_bytes(cap)}, the cap on one value in a row of {self.columns} "
                f"columns, which share the {_bytes(cast(int, self.max_bytes))} cap (select fewer columns)")

    def too_many_bytes(self, rows: int) -> str:
        return (f"query stopped: its rows pass {_bytes(cast(int, self.max_bytes))}, the cap on what a query returns, "
                f"after {rows} row{'s' * (rows != 1)} (select fewer rows or columns)")


def _bytes(count: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} byte{'s' * (count != 1)}"


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
        except (DBAPIError, connection.dialect.loaded_dbapi.Error) as exc:
            # PostgreSQL's rows stream from the driver itself, whose errors SQLAlchemy has not wrapped
            driver_error = exc.orig if isinstance(exc, DBAPIError) else exc
            if bounds.passed or (bounds.timeout_s is not None
                                 and getattr(driver_error, "sqlstate", None) == _PG_QUERY_CANCELED):
                raise StoreError(bounds.stopped()) from None
            if (sys.version_info >= (3, 11) and bounds.cell_cap is not None  # 3.10's sqlite3 lacks the codes
                    and getattr(driver_error, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG):  # else SQLite's own
                raise StoreError(bounds.value_too_large()) from None
            refused = connection.info.get("refused")
            if refused:  # the first thing refused, not what it led to
                raise StoreError(f"read-only connection: {refused[0]} is not allowed") from None
            if _is_write_refused(driver_error):
                raise StoreError(f"read-only connection: {one_line(driver_error, url)}") from None
            raise StoreError(f"query failed: {one_line(driver_error, url)}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"query failed: {one_line(exc, url)}") from None
    return answer


def _answer(connection: Any, sql: str, params: dict[str, Any], keyword: str, bounds: _Bounds) -> Answer:
    """The statement's columns and rows, at most max_rows of them (one more is read to tell that there were more),
    read one at a time and stopped past the byte caps."""
    if not bounds.typed:
        result = connection.execute(text(sql), params)
        return Answer(list(result.keys()), result.fetchall()) if result.returns_rows else Answer([], [])
    described = _describe(connection, sql, params, bounds) if keyword in _SUBQUERY_QUESTIONS else None
    bounds.share_bytes(len(described[0]) if described else None)
    read = _sqlite_rows if connection.dialect.name == "sqlite" else _pg_rows
    columns, sized_rows = read(connection, sql, params, described, bounds)
    with closing(sized_rows):  # a PostgreSQL stream left early is cancelled, before the transaction ends
        rows: list[Sequence[Any]] = []
        total_bytes = 0
        for row, row_bytes in sized_rows:
            if bounds.max_rows is not None and len(rows) == bounds.max_rows:
                return Answer(columns, rows, truncated=True)
            total_bytes += row_bytes
            if bounds.max_bytes is not None and total_bytes > bounds.max_bytes:
                raise StoreError(bounds.too_many_bytes(len(rows)))
            rows.append(row)
    return Answer(columns, rows)


def _describe(connection: Any, sql: str, params: dict[str, Any], bounds: _Bounds) -> tuple[list[str], list[Any]]:
    """The question's column names and driver type codes, from the question as a subquery asked for no rows (which
    runs nothing)."""
    bounds.limit_next_statement(connection)
    result = connection.execute(text(f"SELECT * FROM (\n{_as_subquery(sql)}\n) AS question LIMIT 0"), params)
    described = list(result.keys()), [column[1] for column in result.cursor.description]
    result.close()
    return described


def _as_subquery(sql: str) -> str:
    return re.sub(r"[\s;]+$", "", sql)


def _sqlite_rows(connection: Any, sql: str, params: dict[str, Any], _described: Any,
                 bounds: _Bounds) -> tuple[list[str], _SizedRows]:
    """SQLite refuses, as too big, any string or blob over the cap on one value, stored or computed on the way (a
    byte over it: some functions count a terminating NUL; the exact cap is the row's check as it arrives)."""
    setlimit = getattr(connection.connection.driver_connection, "setlimit", None)
    if bounds.cell_cap is not None and setlimit is not None:  # Python 3.10 has none: values are measured on arrival
        setlimit(sqlite3.SQLITE_LIMIT_LENGTH, bounds.cell_cap + 1)  # type: ignore[attr-defined]  # 3.11+, as setlimit
    result = connection.execute(text(sql), params)  # a pysqlite result steps one row per row read
    if not result.returns_rows:
        return [], _sized((), bounds)
    return list(result.keys()), _sized(result, bounds)


def _pg_rows(connection: Any, sql: str, params: dict[str, Any], described: tuple[list[str], list[Any]] | None,
             bounds: _Bounds) -> tuple[list[str], _SizedRows]:
    """The rows in single-row mode, so that no more than one arrives before it is counted; a question that stands as
    a subquery has every value measured in SQL, and one over the cap withheld, before it is sent."""
    measured = bool(described and described[0]) and bounds.cell_cap is not None
    statement = _pg_measured(sql, cast(Any, described)[1], cast(int, bounds.cell_cap)) if measured else sql
    compiled = text(statement).compile(dialect=connection.dialect)
    driver_params = compiled.construct_params(params)
    cursor = connection.connection.driver_connection.cursor()
    bounds.limit_next_statement(connection)
    stream = cursor.stream(compiled.string, driver_params)
    if measured:
        return cast(Any, described)[0], _measured_rows(stream, bounds)
    if described:
        return described[0], _sized(stream, bounds)
    first = next(stream, None)  # the driver knows the columns of an EXPLAIN or a SHOW once its first row is in
    columns = [column.name for column in cursor.description or ()]
    return columns, _sized(stream, bounds, first=() if first is None else (first,))


def _pg_measured(sql: str, type_codes: list[Any], cell_cap: int) -> str:
    """The question with each row's values, the largest value's size and the row's size after them, every size
    taken in SQL and a value over cell_cap withheld (NULL). OFFSET 0 keeps each subquery whole, so that no
    expression of the question is evaluated once per reference to it."""
    names = [f"c{i}" for i in range(len(type_codes))]
    sizes = [f"octet_length({name}{'' if code in _PG_MEASURED_AS_IS else '::text'})::bigint AS b{i}"
             for i, (name, code) in enumerate(zip(names, type_codes))]
    values = [f"CASE WHEN b{i} <= {cell_cap} THEN {name} END" for i, name in enumerate(names)]
    largest = f"COALESCE(GREATEST({', '.join(f'b{i}' for i in range(len(names)))}), 0)"
    row_bytes = " + ".join(f"COALESCE(b{i}, 0)" for i in range(len(names)))
    return (f"SELECT {', '.join(values)}, {largest}, {row_bytes} FROM (SELECT *, {', '.join(sizes)} FROM "
            f"(SELECT * FROM (\n{_as_subquery(sql)}\n) AS question OFFSET 0) AS fenced({', '.join(names)}) "
            "OFFSET 0) AS measured")


def _measured_rows(stream: Generator[tuple[Any, ...], None, None], bounds: _Bounds) -> _SizedRows:
    with closing(stream):
        for row in stream:
            if row[-2] > bounds.cell_cap:
                raise StoreError(bounds.value_too_large())
            yield row[:-2], row[-1]


def _sized(rows: Iterable[Sequence[Any]], bounds: _Bounds, first: tuple[Sequence[Any], ...] = ()) -> _SizedRows:
    """The rows already read (`first`), then the others, each with its size as it arrived; `rows` (a driver's
    stream, a result) is closed when left."""
    try:
        for row in chain(first, rows):
            yield row, _row_bytes(row, bounds)
    finally:
        if hasattr(rows, "close"):
            rows.close()


def _row_bytes(row: Sequence[Any], bounds: _Bounds) -> int:
    """A row's size as it arrived: bytes of its text in UTF-8 (what a terminal, a file or JSON takes: 2M emoji
    are 2M characters but 8 MB), bytes of a blob, JSON's text, 8 for a number or a date."""
    sizes = [_text_bytes(value) if isinstance(value, str) else len(value) if isinstance(value, (bytes, bytearray))
             else _text_bytes(json.dumps(value, default=str, ensure_ascii=False)) if isinstance(value, (dict, list))
             else 8 for value in row]
    if bounds.cell_cap is not None and max(sizes, default=0) > bounds.cell_cap:
        raise StoreError(bounds.value_too_large())
    return sum(sizes)


def _text_bytes(text: str) -> int:
    """`text`'s size in UTF-8, without encoding it where it is ASCII (the common case: one byte a character)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


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


def _is_write_refused(driver_error: BaseException | None) -> bool:
    if getattr(driver_error, "sqlstate", None) in _PG_REFUSALS:
        return True
    return "readonly database" in str(driver_error)


def render(columns: list[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Rows as a GitHub-Markdown table, CSV with a header, or a JSON list of objects."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else _json_text(_plain(v)) for v in row] for row in rows])
        return out.getvalue()
    if fmt == "json":
        # Characters as they are, not \u escapes: the output is the size the byte caps counted, not six times it.
        return json.dumps([{c: _plain(v) for c, v in zip(columns, row)} for row in rows], indent=2, ensure_ascii=False)
    numeric = [all(v is None or _is_number(v) for v in column) for column in zip(*rows)] or [False] * len(columns)
    cells = [[_cell(v) for v in row] for row in rows]
    padded_chars = (len(cells) + 2) * sum(max(map(len, column)) + 3 for column in zip(columns, *cells))
    plain_chars = sum(len(cell) + 3 for row in (columns, *cells) for cell in row)
    if padded_chars > max(TABLE_PADDING_MAX_CHARS, 2 * plain_chars):
        lines = ["| " + " | ".join(row) + " |" for row in (columns, *cells)]
        rule = "|" + "|".join("---" for _ in columns) + "|"
        return "\n".join([lines[0], rule, *lines[1:]])
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
    return short(value, TABLE_SIGNIFICANT_DIGITS)
