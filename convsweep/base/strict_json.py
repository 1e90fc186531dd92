"""Result files read strictly, so that no file can stop the ingest of the others: bounded size and
nesting, and only numbers a database column holds (finite floats, 64-bit integers) and times it
holds (ISO 8601). What Python's json would take silently (NaN, Infinity, 1e309, a 10^30 integer)
or crash on (a 200,000-deep array) is one StoreError line naming the file and the key; so is a
document that breaks its schema (check_schema: the ingest of profiles and confirmations opens with it)."""

from __future__ import annotations

import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from .errors import ConfigError, StoreError
from .schema import key_path, validate

# A job file is ~5 kB a setting (docs/scaling.md; the fixtures' largest is 35 kB), most of it samples:
# a job of 288 settings at the stopping rule's 200 samples of 4 metrics writes ~25 MB. A file past
# 64 MB is not a result, and parsing it would take gigabytes of memory.
MAX_RESULT_BYTES = 64 * 2**20
# Objects and arrays inside one another: a result file goes 7 deep (measurements[i].builds[j].kernels[k]).
# Python's json recurses per level and gives up with a RecursionError near 1,000.
MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1  # SQLite's INTEGER and PostgreSQL's BIGINT
_MAX_INT_DIGITS = len(str(INT64_MAX))
MAX_SHOWN_CHARS = 40  # of a number quoted in an error line

_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash and the character it escapes (\" included)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_OPENING = frozenset(b"[{")


class _Refused:
    """A number literal the parser would not store, kept with its text until its key path is known."""

    __slots__ = ("text", "expected")

    def __init__(self, text: str, expected: str):
        self.text, self.expected = text, expected


def read_json(path: str | Path, max_bytes: int = MAX_RESULT_BYTES) -> Any:
    """A result file's JSON; unreadable, oversized, too deeply nested or non-JSON files, and numbers
    no column can hold, raise StoreError naming the file (and the key)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:  # refused unread
                raise StoreError(f"{path}: {size:,} bytes; a result file holds at most {max_bytes:,}")
            data = f.read(max_bytes + 1)  # never more, whatever the file (a pipe, one still growing)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise StoreError(f"{path}: more than {max_bytes:,} bytes; a result file holds at most {max_bytes:,}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if nesting_depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise StoreError(f"{path}: not valid JSON: nested more than {MAX_DEPTH} levels deep")
    refused: list[_Refused] = []

    def refuse(text: str, expected: str) -> _Refused:
        refused.append(_Refused(text, expected))
        return refused[-1]

    def parse_float(text: str) -> float | _Refused:
        value = float(text)
        return value if math.isfinite(value) else refuse(text, "a finite number")

    def parse_int(text: str) -> int | _Refused:
        # Checked before int(): past 4,300 digits int() itself raises ValueError.
        if len(text.lstrip("-")) <= _MAX_INT_DIGITS and INT64_MIN <= (value := int(text)) <= INT64_MAX:
            return value
        return refuse(text, "a 64-bit integer")

    try:
        document = json.loads(text, parse_float=parse_float, parse_int=parse_int,
                              parse_constant=lambda name: refuse(name, "a finite number"))
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path}: not valid JSON: {exc}") from None
    if refused:
        check_values(document, str(path))
    return document


def nesting_depth(data: bytes, limit: int) -> int:
    """How deep JSON nests objects and arrays outside its strings, counted up to limit + 1 without
    recursing; bytes operations first, so the loop sees brackets only (~0.05 ms for a 14 kB file)."""
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)  # so that every quote left opens or closes a string
    brackets = b"".join(data.translate(None, _NOT_STRUCTURE).split(b'"')[::2])  # even pieces: outside strings
    depth = deepest = 0
    for bracket in brackets:
        if bracket in _OPENING:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def check_values(document: Any, source: str) -> None:
    """Raise StoreError at the first value in document order that no column can hold: a non-finite
    float, an integer past 64 bits, a number read_json refused, or a nesting past MAX_DEPTH."""
    if not _surely_storable(document):
        _raise_first_problem(document, source)


def check_schema(document: Any, schema: str, source: str) -> None:
    """Raise StoreError, one line naming `source` and the key, where a file's document breaks its schema (a name
    in workflow/schemas/); its defaults are not filled in: what is stored is what the file said."""
    try:
        validate(document, schema, source, fill_defaults=False)
    except ConfigError as exc:
        raise StoreError(str(exc)) from None


def utc_time(value: str | None, source: str, key: str) -> datetime | None:
    """A file's ISO 8601 time as an aware UTC datetime (a time without a zone is taken as UTC);
    None stays None, and a value that is not such a time raises StoreError naming the file and key."""
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


def _surely_storable(document: Any) -> bool:
    """True when no value is a problem; False when one may be (then _raise_first_problem looks, with
    the key paths this does not keep). Exact types only: ~10 times faster than isinstance and paths."""
    stack = [([document], 0)]
    while stack:
        container, depth = stack.pop()
        for item in container.values() if type(container) is dict else container:
            kind = type(item)
            if kind is float:
                if item - item != 0.0:  # inf - inf and nan - nan are nan
                    return False
            elif kind is int:
                if not INT64_MIN <= item <= INT64_MAX:
                    return False
            elif kind is dict or kind is list:
                if depth >= MAX_DEPTH:
                    return False
                stack.append((item, depth + 1))
            elif not (kind is str or kind is bool or item is None):  # a refused number, numpy, a tuple ...
                return False
    return True


def _raise_first_problem(document: Any, source: str) -> None:
    """Walk in document order keeping the key path; iterative, so a deep document cannot exhaust the stack."""
    path: list[str | int] = []
    stack: list[tuple[int, str | int | None, Any]] = [(0, None, document)]
    while stack:
        depth, key, value = stack.pop()
        del path[max(depth - 1, 0):]
        if depth:
            path.append(cast(str | int, key))  # below the top, each value has its key or index
        problem = _problem(value)
        if problem is None and isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
            problem = f"nested more than {MAX_DEPTH} levels deep"
        if problem is not None:
            raise StoreError(f"{source}: {key_path(path)}: {problem}")
        if isinstance(value, dict):
            stack.extend((depth + 1, k, v) for k, v in reversed(value.items()))
        elif isinstance(value, (list, tuple)):
            stack.extend((depth + 1, i, value[i]) for i in range(len(value) - 1, -1, -1))


def _problem(value: Any) -> str | None:
    if isinstance(value, _Refused):
        return f"expected {value.expected}, got {_shown(value.text)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number, got {json.dumps(value)}"  # NaN, Infinity or -Infinity
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        try:
            shown = _shown(str(value))
        except ValueError:  # past sys.get_int_max_str_digits()
            shown = f"an integer of {value.bit_length()} bits"
        return f"expected a 64-bit integer, got {shown}"
    return None


def _shown(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS - 3]}... ({len(text)} characters)"
