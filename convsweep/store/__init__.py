"""The result store: SQLAlchemy models of runs and what was measured with them (`models`), opening
and migrating SQLite or PostgreSQL (`engine`), and the idempotent ingest of result JSON files
(`ingest`, which reads them strictly through `strict_json`), and Nsight Compute's profiles of the
kernels (`profiles`), and the confirmations of a cell's winners (`confirmations`). Queries read it through convsweep.analysis.query.

The names below load their module on first use (PEP 562): `convsweep report` and the read-only
queries need only `engine`, not the ORM models and the ingest (~0.2 s of imports per process).
"""
from __future__ import annotations

import importlib

_HOME = {
    "ceilings": ["ingest_ceiling", "refresh_floors"],
    "confirmations": ["ingest_confirmation"],
    "engine": ["alembic_config", "bring_up_to_date", "make_engine", "migrate", "one_line", "open_store", "resolve_url", "show_url",
               "sqlite_path"],
    "ingest": ["check_result", "ingest_files", "ingest_result", "read_result"],
    "ingest_report": ["IngestReport"],
    "models": ["Base", "Build", "DeviceCeiling", "Environment", "Confirmation", "KernelProfile", "KernelStat", "LayerTime", "Memcpy", "Phase", "Run",
               "Sample", "Sweep"],
    "profiles": ["ingest_profile"],
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
