"""What the report and the figures both say about stored runs: the baseline speedups are over, the
sentence saying where and when runs were measured, the fastest of several settings, a whole-network
variant, missing data; and the device ceilings a `convsweep bench --json` file holds.

A light module: the Snakefile's planner checks the bench file through it at every `snakemake`, and
the command line and the report import it at start-up, so it imports neither matplotlib nor the
database code.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard, cast

from convsweep.base.errors import ConvsweepError

BASELINE_VARIANT = "naive"
# The columns provenance() reads, for a query joining latest_run r to environment e.
PROVENANCE_COLUMNS = "e.gpu, r.profiler, r.started_at, r.git_commit, r.git_dirty"
COMMITS_SHOWN = 3


class MissingData(ConvsweepError):
    """The database lacks what one figure needs; `plot all` skips that figure and says why."""


# -- the bench file's ceilings ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Ceilings:
    """The device's measured rates from a `convsweep bench --json` file: device-to-device copy
    (read + write, the rate floor bytes move at) and matmul per precision."""

    source: str
    device: str | None
    copy_gbps: float
    matmul_tflops: dict[str, float] = field(default_factory=dict)


def load_ceilings(path: str | Path) -> Ceilings:
    """The copy bandwidth and matmul rates a `convsweep bench --json` file measured."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConvsweepError(f"--bench {path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ConvsweepError(f"--bench {path}: not JSON ({e})") from None
    ceilings = data.get("ceilings") if isinstance(data, dict) else None
    copy_gbps = ceilings.get("dtod_GBps") if isinstance(ceilings, dict) else None
    if not _positive(copy_gbps):
        raise ConvsweepError(f"--bench {path}: no ceilings.dtod_GBps (the device copy rate): expected the file "
                             "`convsweep bench --json FILE` writes")
    # A positive copy rate: ceilings is its dict.
    matmul = cast(dict, ceilings).get("matmul_TFLOPps") or {}
    return Ceilings(source=str(path), device=data.get("device"), copy_gbps=float(copy_gbps),
                    matmul_tflops={mode: float(v) for mode, v in matmul.items() if _positive(v)})


def _positive(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# -- runs ------------------------------------------------------------------------------------------------
def fastest(rows: Iterable[dict[str, Any]], keys: Sequence[str],
            time: str = "op_time_ms") -> tuple[dict[tuple, dict[str, Any]], bool]:
    """The row with the least `time` per value of `keys`, and whether any key held several rows
    (tunable settings, stream counts or host memories that the keys do not tell apart)."""
    best: dict[tuple, dict[str, Any]] = {}
    several = False
    for row in rows:
        key = tuple(row[k] for k in keys)
        if key in best:
            several = True
            if row[time] >= best[key][time]:
                continue
        best[key] = row
    return best, several


def whole_network(variant: str) -> bool:
    """Whether a registered variant's kernel runs on to the network's end: its first layer's op time
    is every layer's, which a reader comparing it with one conv layer's must be told."""
    from convsweep.model.variants import load_registry

    entry = load_registry().get(variant)
    return bool(entry is not None and entry.fuses_tail)


def provenance(rows: Sequence[dict[str, Any]]) -> str:
    """'Measured on GPU, dates, at commit(s)' for the runs a figure shows. Only a GPU that a run opened is
    named (a run that failed before opening one stores none), and the CPU for the CPU reference's runs."""
    gpus = sorted({r["gpu"] for r in rows if r["gpu"]} | {"the CPU" for r in rows if not r["gpu"] and
                                                          r.get("profiler") == "cpu"})
    days = sorted({d for d in (_day(r["started_at"]) for r in rows) if d})
    commits = list(dict.fromkeys(str(r["git_commit"])[:10] for r in sorted(
        (r for r in rows if r["git_commit"]), key=lambda r: _day(r["started_at"]) or "")))  # oldest first
    when = "on an unrecorded date" if not days else f"on {days[0]}" if len(days) == 1 \
        else f"from {days[0]} to {days[-1]}"
    shown = ", ".join(commits[:COMMITS_SHOWN]) + (f" and {len(commits) - COMMITS_SHOWN} more"
                                                   if len(commits) > COMMITS_SHOWN else "")
    at = "at an unrecorded commit" if not commits else f"at commit{'s' if len(commits) > 1 else ''} {shown}"
    dirty = " (with uncommitted changes)" if any(r["git_dirty"] for r in rows) else ""
    if not gpus:
        return f"No run opened a GPU (runs {when}, {at}{dirty})."
    return f"Measured on {' and '.join(gpus)} {when}, {at}{dirty}."


def _day(value: Any) -> str | None:
    """The date of a started_at value: PostgreSQL gives a datetime, SQLite its text."""
    if value is None:
        return None
    return value.date().isoformat() if hasattr(value, "date") else str(value)[:10]
