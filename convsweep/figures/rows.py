"""What the figures read from the database: the stored experiments, and the conv layer rows most
figures draw, each named by its series (variant, whole network, and the axes that set series apart:
a cold L2).

The database is read through convsweep.analysis.query (read-only, SQLite or PostgreSQL alike), imported only
when a figure reads: SQLAlchemy is slow to load.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from convsweep.base.axes import columns as axis_columns, series_suffix
from convsweep.base.fileio import json_column
from convsweep.analysis.reading import PROVENANCE_COLUMNS, MissingData, whole_network

# Each setting's conv layers' DRAM traffic in its latest Nsight Compute profile (table kernel_profile).
NCU_DRAM_BYTES_SQL = """
    SELECT run_key, layer, SUM(dram_read_bytes + dram_write_bytes) AS dram_bytes
    FROM latest_kernel_profile
    GROUP BY run_key, layer"""


def fetch(url: str | None, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a read-only query as dicts."""
    from convsweep.analysis.query import fetch_dicts

    return fetch_dicts(url, sql, params)[1]


def experiments(url: str | None) -> list[str]:
    """Every experiment with a stored run, by name."""
    return [r["experiment"] for r in fetch(url, "SELECT DISTINCT experiment FROM latest_run ORDER BY experiment", {})]


def layer_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """Every conv layer of the latest measurement of each setting of `experiment`, any status,
    with its op time, floors, tunables and provenance."""
    rows = fetch(url, f"""
        SELECT r.id AS run_id, r.variant, lt.variant AS layer_variant, lt.params, lt.layer_index, lt.layer,
               {axis_columns("r")}, r.status, lt.op_time_ms, lt.flops, lt.bytes,
               ncu.dram_bytes, {PROVENANCE_COLUMNS}
        FROM layer_time lt
        JOIN latest_run r ON r.id = lt.run_id
        JOIN environment e ON e.id = r.environment_id
        LEFT JOIN ({NCU_DRAM_BYTES_SQL}) ncu ON ncu.run_key = r.run_key AND ncu.layer = lt.layer
        WHERE r.experiment = :experiment
        ORDER BY lt.layer_index, r.batch, r.id""", {"experiment": experiment})
    for row in rows:
        row["params"] = json_column(row["params"]) or {}
        row["series"] = row["variant"] + whole_network_suffix(row["variant"]) + series_suffix(row)
    return rows


def whole_network_suffix(variant: str) -> str:
    """' (whole network)' for a variant whose kernel runs on to the network's end: its first layer's
    op time is every layer's, and a reader comparing it with one conv layer's must be told."""
    return " (whole network)" if whole_network(variant) else ""


def timed_layers(rows: Iterable[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
    """The layer rows of ok runs that have an op time (incorrect and failed runs never show as a
    time); MissingData when none has."""
    timed = [r for r in rows if r["status"] == "ok" and r["op_time_ms"]]
    if not timed:
        raise MissingData(f"experiment {experiment!r} has no ok run with conv layer op times")
    return timed


def conv_layers(rows: Iterable[dict[str, Any]]) -> list[tuple[int, str]]:
    """(layer_index, layer) of the conv layers the rows hold, in network order."""
    return sorted({(r["layer_index"], r["layer"]) for r in rows})
