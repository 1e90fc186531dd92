"""`convsweep report`: an experiment as the course reports were typed by hand, generated. First what its
sweep asked for and has no result of (coverage); then per variant: the seeds' table, the speedup over
the previous variant and over the naive baseline, and what Nsight Compute says bounds each conv kernel; then
which variants lie on each conv layer's front of op time against energy per pass, where energy was measured;
then the figures. Written as Markdown (report.md, figures
linked), as one self-contained HTML page (figures embedded: what the Snakemake report shows) and as
CSV tables.

The database is read through convsweep.analysis.query (read-only, SQLite or PostgreSQL alike), imported only
when a report is made: SQLAlchemy is slow to load.

The parts, each doing one thing: `runs` (an experiment's runs loaded, and what follows from them alone), `cells` (how a value is
written), `coverage` (what the sweep asked for and has no result of), `sections` (the document's blocks),
`tables` (the CSV rows and summary.md) and `files` (what is written).
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cells import tunables
    from .runs import CELL_COLUMNS, RUNS_SQL, Experiment, NoRuns, cell, fastest, load, speedup, variant_order
    from .sections import build
    from .tables import SEEDS_CSV_COLUMNS, seeds_rows, summary_markdown, why_rows
    from .files import Written, write

# Loaded when first used: the Snakefile imports `coverage` alone, and the rest (the figure registry, the
# document model) would cost every `snakemake` a tenth of a second.
_PARTS = ("cells", "runs", "coverage", "sections", "tables", "files")
_EXPORTS = {"tunables": "cells", "CELL_COLUMNS": "runs", "RUNS_SQL": "runs", "Experiment": "runs", "NoRuns": "runs",
            "cell": "runs", "fastest": "runs", "load": "runs", "speedup": "runs", "variant_order": "runs",
            "build": "sections", "SEEDS_CSV_COLUMNS": "tables", "seeds_rows": "tables",
            "summary_markdown": "tables", "why_rows": "tables", "Written": "files", "write": "files"}
__all__ = ["CELL_COLUMNS", "RUNS_SQL", "SEEDS_CSV_COLUMNS", "Experiment", "NoRuns", "Written", "build", "cell",
           "fastest", "load", "seeds_rows", "speedup", "summary_markdown", "tunables", "variant_order", "why_rows",
           "write"]  # _EXPORTS' keys (a test holds them equal)


def __getattr__(name: str) -> Any:
    if name in _PARTS:
        return import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
