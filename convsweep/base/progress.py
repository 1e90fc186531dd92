"""Progress bars for long work (the float64 reference, a job's settings, bench candidates, ingest),
drawn by tqdm on stderr so that stdout stays the command's output and job logs stay readable.

A bar shows when stderr is a terminal; CONVSWEEP_PROGRESS=1 asks for it anywhere (a log file
gets tqdm's carriage-return updates), CONVSWEEP_PROGRESS=0 silences it even on a terminal.
tqdm is imported on first use, so that importing a module that shows progress stays cheap.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

ENV_VAR = "CONVSWEEP_PROGRESS"


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str | None = None,
             unit: str = "it", enabled: bool = True) -> Any:
    """A tqdm bar over `iterable` (or, given none, one moved by `.update(n)` up to `total`), on
    stderr when wanted; `enabled=False` keeps it silent, for work too short to be worth a bar."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=not (enabled and wanted()))


def wanted() -> bool:
    """Whether bars are shown: CONVSWEEP_PROGRESS=1 or 0 decides, else whether stderr is a terminal."""
    asked = os.environ.get(ENV_VAR, "").strip()
    if asked in ("0", "1"):
        return asked == "1"
    return sys.stderr is not None and sys.stderr.isatty()
