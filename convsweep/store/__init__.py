"""The result store: SQLAlchemy models of runs and what was measured with them (`models`), opening
and migrating SQLite or PostgreSQL (`engine`), and the idempotent ingest of result JSON files
(`ingest`). Queries read it through convsweep.query."""

from .engine import alembic_config, make_engine, migrate, one_line, open_store, resolve_url, show_url, sqlite_path
from .ingest import IngestReport, build_key, check_result, ingest_files, ingest_result, measurement_id, read_result
from .models import Base, Build, Environment, KernelStat, LayerTime, Memcpy, Phase, Run, Sample, Sweep

__all__ = ["alembic_config", "make_engine", "migrate", "one_line", "open_store", "resolve_url", "show_url",
           "sqlite_path", "IngestReport", "build_key", "check_result", "ingest_files", "ingest_result",
           "measurement_id", "read_result", "Base", "Build", "Environment", "KernelStat", "LayerTime", "Memcpy",
           "Phase", "Run", "Sample", "Sweep"]
