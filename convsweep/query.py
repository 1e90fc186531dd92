"""Ad-hoc and named SQL over the result store, on a connection that cannot write."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool
from tabulate import tabulate

from convsweep.errors import StoreError
from convsweep.store import DB_DIR, make_engine, one_line, resolve_url, show_url, sqlite_path

QUERIES_DIR = DB_DIR / "queries"
FORMATS = ("table", "csv", "json")
TABLE_SIGNIFICANT_DIGITS = 4
_QUERY_NAME = re.compile(r"[A-Za-z0-9_-]+")
_PG_READ_ONLY = "25006"  # SQLSTATE read_only_sql_transaction


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
    sql = resolve_sql(sql_or_name)
    sa_url = resolve_url(url)
    engine = _read_only_engine(sa_url)
    try:
        columns, rows = _fetch(engine, sa_url, sql, params or {})
    finally:
        engine.dispose()
    return render(columns, rows, fmt)


def _read_only_engine(url: URL) -> Engine:
    path = sqlite_path(url)
    if path is not None:
        if not path.is_file():
            raise StoreError(f"no database at {path}: run a sweep first")
        url = URL.create("sqlite", database=f"file:{quote(str(path.resolve()))}",
                         query={"mode": "ro", "uri": "true"})
    elif url.get_backend_name() == "sqlite":
        raise StoreError(f"cannot open {show_url(url)} read-only: give a SQLite file or a server URL")
    return make_engine(url, read_only=True, poolclass=NullPool)


def _fetch(engine: Engine, url: URL, sql: str, params: dict[str, Any]) -> tuple[list[str], list[Sequence[Any]]]:
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        raise StoreError(f"database {show_url(url)} unreachable: {one_line(exc, url)}") from None
    try:
        with connection, connection.begin() as transaction:
            if connection.dialect.name == "postgresql":
                connection.exec_driver_sql("SET TRANSACTION READ ONLY")
            result = connection.execute(text(sql), params)
            if result.returns_rows:
                columns, rows = list(result.keys()), result.fetchall()
            else:
                columns, rows = [], []
            transaction.rollback()
    except DBAPIError as exc:
        if _is_write_refused(exc):
            raise StoreError(f"read-only connection: {one_line(exc, url)}") from None
        raise StoreError(f"query failed: {one_line(exc, url)}") from None
    except SQLAlchemyError as exc:
        raise StoreError(f"query failed: {one_line(exc, url)}") from None
    return columns, rows


def _is_write_refused(exc: DBAPIError) -> bool:
    if getattr(exc.orig, "sqlstate", None) == _PG_READ_ONLY:
        return True
    return "readonly database" in str(exc.orig)


def render(columns: list[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Rows as a GitHub-Markdown table, CSV with a header, or a JSON list of objects."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else _plain(v) for v in row] for row in rows])
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


def _cell(value: Any) -> str:
    """A table cell: floats to a few significant digits, positional where that stays short."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        value = _plain(value)
    if not isinstance(value, float):
        return str(_plain(value))
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = math.floor(math.log10(abs(value)))
    if -4 <= magnitude < 6:
        return f"{value:.{max(0, TABLE_SIGNIFICANT_DIGITS - 1 - magnitude)}f}"
    return f"{value:.{TABLE_SIGNIFICANT_DIGITS - 1}e}"
