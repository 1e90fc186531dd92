"""Ad-hoc and named SQL over the result store, on a connection that cannot write.

Read-only in depth: one statement, and it must be a question (SELECT, WITH, VALUES, TABLE,
EXPLAIN, SHOW; PRAGMA on SQLite). SQLite opens the file with mode=ro and query_only, and an
authorizer allows reads alone (no ATTACH, which would create a file; no pragma that writes; no
extension loading). PostgreSQL runs it in a READ ONLY transaction and, for a role that could
reach the server's files (a superuser, say), as pg_read_all_data, so COPY TO a file,
pg_read_file() and lo_export() are refused too.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sqlite3
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
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
TABLE_SIGNIFICANT_DIGITS = 4
_QUERY_NAME = re.compile(r"[A-Za-z0-9_-]+")
_PG_REFUSALS = {"25006", "42501"}  # SQLSTATE read_only_sql_transaction, insufficient_privilege
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


def run_query(url: str | None, sql_or_name: str, fmt: str = "table",
              params: dict[str, Any] | None = None) -> str:
    """Run a named query or SQL read-only and render the rows as a Markdown table, CSV or JSON."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown output format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return render(*fetch(url, sql_or_name, params), fmt)


def fetch(url: str | None, sql_or_name: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[Sequence[Any]]]:
    """(column names, rows) of a named query or SQL, run read-only."""
    sql = resolve_sql(sql_or_name)
    sa_url = resolve_url(url)
    _check_question(sql, _SQLITE_QUESTIONS if sa_url.get_backend_name() == "sqlite" else QUESTIONS)
    engine = _read_only_engine(sa_url)
    try:
        return _fetch(engine, sa_url, sql, params or {})
    finally:
        engine.dispose()


def fetch_dicts(url: str | None, sql_or_name: str, params: dict[str, Any] | None = None
                ) -> tuple[list[str], list[dict[str, Any]]]:
    """fetch, each row a dict by column name."""
    columns, rows = fetch(url, sql_or_name, params)
    return columns, [dict(zip(columns, row)) for row in rows]


def _read_only_engine(url: URL) -> Engine:
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
    return engine


def _check_question(sql: str, allowed: tuple[str, ...]) -> None:
    """Refuse anything but one of the statement kinds that ask (a write fails anyway; this also
    stops DO blocks and SET ROLE, which a superuser's session could otherwise use)."""
    body = _LEADING_NOISE.sub("", sql, count=1)
    keyword = (re.match(r"[A-Za-z]+", body) or [""])[0].upper()
    if keyword not in allowed:
        raise StoreError(f"read-only connection: convsweep query runs one {', '.join(allowed)} statement, "
                         f"got {keyword or repr(sql.strip()[:20])}")


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


def _fetch(engine: Engine, url: URL, sql: str, params: dict[str, Any]) -> tuple[list[str], list[Sequence[Any]]]:
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        raise StoreError(f"database {show_url(url)} unreachable: {one_line(exc, url)}") from None
    with connection:
        try:
            with connection.begin() as transaction:
                if connection.dialect.name == "postgresql":
                    connection.exec_driver_sql("SET TRANSACTION READ ONLY")
                    _without_server_files(connection, url)
                result = connection.execute(text(sql), params)
                columns, rows = (list(result.keys()), result.fetchall()) if result.returns_rows else ([], [])
                transaction.rollback()
        except DBAPIError as exc:
            refused = connection.info.get("refused")
            if refused:
                raise StoreError(f"read-only connection: {refused[0]} is not allowed") from None  # the first, not what it led to
            if _is_write_refused(exc):
                raise StoreError(f"read-only connection: {one_line(exc, url)}") from None
            raise StoreError(f"query failed: {one_line(exc, url)}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"query failed: {one_line(exc, url)}") from None
    return columns, rows


def _without_server_files(connection: Any, url: URL) -> None:
    """A role that can read or write the server's files keeps that power in a read-only
    transaction; run the query as pg_read_all_data (PostgreSQL 14+), which reads every table."""
    checks = " OR ".join(f"pg_has_role(current_user, '{role}', 'MEMBER')" for role in _PG_FILE_ROLES)
    risky = connection.exec_driver_sql(
        f"SELECT rolsuper OR {checks} FROM pg_roles WHERE rolname = current_user").scalar()
    if not risky:
        return
    try:
        connection.exec_driver_sql("SET LOCAL ROLE pg_read_all_data")
    except DBAPIError as exc:
        raise StoreError(f"read-only connection: role {url.username or '(default)'} can reach the server's files and "
                         f"cannot drop to pg_read_all_data ({one_line(exc, url)}); query as a role without them") from None


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
