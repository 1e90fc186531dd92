"""Every named question `convsweep query` answers: the SQL files of db/queries, which convsweep.analysis.query runs
read-only, and those SQL alone cannot answer, computed in Python over the same read-only reads (a job's
steps across commits: convsweep.analysis.history; the fronts of op time against energy: convsweep.analysis.pareto). A module
above both, so that the SQL runner imports nothing of what is computed with it."""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from convsweep.base.errors import StoreError
from .history import regressions
from .pareto import pareto, pareto_note
from convsweep.base.paths import QUERIES_DIR
from .query import DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_S, FORMATS, Answer, fetch, is_query_name, list_queries, present


@dataclass(frozen=True)
class Computed:
    """A named question answered in Python: `function(url, params)` returns (columns, rows), reading through
    convsweep.analysis.query's read-only fetch_dicts as compare does (cut at max_rows; no timeout of its own). `note`, where
    given, gives the line `convsweep query` shows with the rows: what they leave out, say."""

    function: Callable[[str | None, dict[str, Any] | None], tuple[list[str], Sequence[Sequence[Any]]]]
    description: str
    note: Callable[[str | None, dict[str, Any] | None], str | None] | None = None


COMPUTED: dict[str, Computed] = {
    "regressions": Computed(regressions, "Where did a job's Op Time step up or down across its commits, and by how "
                                         "much (ruptures' change points, each confirmed by a bootstrap verdict "
                                         "beyond 5%)?"),
    "pareto": Computed(pareto, "Which settings of each conv layer and batch does no other beat on both op time and "
                               "energy per pass (the front, each point's op time with its 95% interval), and which "
                               "variants lie on it?", note=pareto_note),
}


def named_queries() -> list[tuple[str, str]]:
    """(name, question it answers) of every named query, the SQL files' and the computed ones, by name: what
    `convsweep query --list` shows."""
    return sorted([*list_queries(), *((name, c.description) for name, c in COMPUTED.items())])


def fetch_question(url: str | None, sql_or_name: str, params: dict[str, Any] | None = None,
                   timeout_s: float | None = DEFAULT_TIMEOUT_S, max_rows: int | None = DEFAULT_MAX_ROWS) -> Answer:
    """A named question's or SQL's answer: a computed one's, else convsweep.analysis.query.fetch's."""
    name = sql_or_name.strip()
    computed = COMPUTED.get(name)
    if computed is None:
        if is_query_name(name) and not (QUERIES_DIR / f"{name}.sql").is_file():
            known = ", ".join(known_name for known_name, _ in named_queries())
            raise StoreError(f"no query named {name!r} in {QUERIES_DIR} (known: {known})")
        return fetch(url, sql_or_name, params, timeout_s=timeout_s, max_rows=max_rows)
    if max_rows is not None and max_rows < 1:
        raise StoreError(f"--max-rows must be 1 or more, got {max_rows}")
    columns, rows = computed.function(url, params)
    cut = max_rows is not None and len(rows) > max_rows
    return Answer(list(columns), list(rows[:max_rows] if cut else rows), truncated=cut)


def run_question(url: str | None, sql_or_name: str, fmt: str = "table", params: dict[str, Any] | None = None,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """convsweep.analysis.query.run_query for every named question, computed ones included."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown output format {fmt!r}: expected one of {', '.join(FORMATS)}")
    rendered = present(fetch_question(url, sql_or_name, params, timeout_s, max_rows), fmt, max_rows)
    computed = COMPUTED.get(sql_or_name.strip())
    note = computed.note(url, params) if computed is not None and computed.note is not None else None
    if not note:
        return rendered
    if fmt != "table":  # CSV and JSON stay machine-readable: the line goes to stderr, as present's cut does
        print(note, file=sys.stderr)
        return rendered
    return f"{rendered}\n\n{note}"
