"""How noisy each median is, and why its sampling stopped: layer_time gains op_time_spread, run
gains forward_spread and stop_reason.

A spread is the median absolute deviation of a median's samples over that median
(convsweep.base.stats.relative_spread, copied here as _relative_spread): robust, so one preempted repeat
does not widen it. It is null where there are no samples (failed runs). Existing rows get theirs
from the sample table, per run and layer for op_time_ms and per run for forward_ms, computed in
Python (neither database has a portable median) so it is the same on both.

The view run_op_time gains op_time_1_spread and op_time_2_spread (layer_index 0 and 1) beside
op_time_1_ms and op_time_2_ms; latest_run shows them after its own op times, and run_summary
appends op_time_1_spread, op_time_2_spread and forward_spread to its columns. PostgreSQL expands
latest_run's r.* when the view is created, so all three views are recreated, on both databases alike.

stop_reason is why a run's timed passes ended: fixed (repeats: N), converged, timeout or
max_samples (repeats: auto, the stopping rule). Every run measured before had a fixed count: those with
samples get 'fixed'; run.repeats stays the number of timed passes taken.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""
from collections.abc import Iterator, Sequence
from itertools import groupby
from statistics import median
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_CHUNK = 1000

RUN_OP_TIME_SQL = """
CREATE VIEW run_op_time AS
SELECT r.id AS run_id, lt1.op_time_ms AS op_time_1_ms, lt2.op_time_ms AS op_time_2_ms,
       lt1.op_time_spread AS op_time_1_spread, lt2.op_time_spread AS op_time_2_spread
FROM run r
LEFT JOIN layer_time lt1 ON lt1.run_id = r.id AND lt1.layer_index = 0
LEFT JOIN layer_time lt2 ON lt2.run_id = r.id AND lt2.layer_index = 1
"""

LATEST_RUN_SQL = """
CREATE VIEW latest_run AS
SELECT ranked.*, o.op_time_1_ms, o.op_time_2_ms, o.op_time_1_spread, o.op_time_2_spread
FROM (SELECT r.*,
             ROW_NUMBER() OVER (PARTITION BY r.run_key
                                ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
      FROM run r) ranked
JOIN run_op_time o ON o.run_id = ranked.id
WHERE ranked.measurement_rank = 1
"""

RUN_SUMMARY_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id,
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread
FROM latest_run r
"""

# The views as 0004 and 0005 left them, for the downgrade.
RUN_OP_TIME_0005_SQL = """
CREATE VIEW run_op_time AS
SELECT r.id AS run_id, lt1.op_time_ms AS op_time_1_ms, lt2.op_time_ms AS op_time_2_ms
FROM run r
LEFT JOIN layer_time lt1 ON lt1.run_id = r.id AND lt1.layer_index = 0
LEFT JOIN layer_time lt2 ON lt2.run_id = r.id AND lt2.layer_index = 1
"""

LATEST_RUN_0005_SQL = """
CREATE VIEW latest_run AS
SELECT ranked.*, o.op_time_1_ms, o.op_time_2_ms
FROM (SELECT r.*,
             ROW_NUMBER() OVER (PARTITION BY r.run_key
                                ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
      FROM run r) ranked
JOIN run_op_time o ON o.run_id = ranked.id
WHERE ranked.measurement_rank = 1
"""

RUN_SUMMARY_0005_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id
FROM latest_run r
"""

# Snapshots of the tables as this revision knows them (not the models, which move on).
run_table = sa.table("run", sa.column("id", sa.Integer()), sa.column("forward_spread", sa.Float()))
layer_time_table = sa.table(
    "layer_time",
    sa.column("run_id", sa.Integer()),
    sa.column("layer", sa.String()),
    sa.column("op_time_spread", sa.Float()),
)
sample_table = sa.table(
    "sample",
    sa.column("run_id", sa.Integer()),
    sa.column("metric", sa.String()),
    sa.column("layer", sa.String()),
    sa.column("value", sa.Float()),
)


# A frozen copy of convsweep.base.stats.relative_spread, not an import of it: a migration must backfill the
# same numbers whenever it runs, however stats.py changes later (and must not fail when it moves).
def _relative_spread(values: Sequence[float | None]) -> float | None:
    """Median absolute deviation over the median; None for no samples or a zero median."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    centre = median(present)
    return median(abs(v - centre) for v in present) / centre if centre else None


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")
    op.execute("DROP VIEW IF EXISTS run_op_time")


def _spreads(connection: sa.Connection) -> Iterator[tuple[int, str, str | None, float]]:
    """(run id, metric, layer, relative spread) of every run's op_time_ms samples per layer and
    forward_ms samples, read one (run, metric, layer) group at a time; groups without one left out."""
    rows = connection.execute(
        sa.select(sample_table.c.run_id, sample_table.c.metric, sample_table.c.layer, sample_table.c.value)
        .where(sample_table.c.metric.in_(("op_time_ms", "forward_ms")))
        .order_by(sample_table.c.run_id, sample_table.c.metric, sample_table.c.layer))
    for (run_id, metric, layer), group in groupby(rows, key=lambda row: (row[0], row[1], row[2])):
        spread = _relative_spread([row[3] for row in group])
        if spread is not None:
            yield run_id, metric, layer, spread


def _fill_spreads(connection: sa.Connection) -> None:
    """Each layer_time row's op_time_spread and each run's forward_spread, from its samples."""
    layer_updates: list[dict[str, Any]] = []
    run_updates: list[dict[str, Any]] = []
    for run_id, metric, layer, spread in _spreads(connection):
        if metric == "op_time_ms":
            layer_updates.append({"b_run_id": run_id, "b_layer": layer, "op_time_spread": spread})
        elif layer is None:
            run_updates.append({"b_id": run_id, "forward_spread": spread})
        if len(layer_updates) + len(run_updates) >= BACKFILL_CHUNK:
            _update(connection, layer_updates, run_updates)
    _update(connection, layer_updates, run_updates)


def _update(connection: sa.Connection, layer_updates: list[dict[str, Any]], run_updates: list[dict[str, Any]]) -> None:
    if layer_updates:
        connection.execute(
            sa.update(layer_time_table).where(layer_time_table.c.run_id == sa.bindparam("b_run_id"),
                                              layer_time_table.c.layer == sa.bindparam("b_layer")),
            layer_updates)
        layer_updates.clear()
    if run_updates:
        connection.execute(sa.update(run_table).where(run_table.c.id == sa.bindparam("b_id")), run_updates)
        run_updates.clear()


def upgrade() -> None:
    _drop_views()
    # Nullable columns without constraints: a plain ADD COLUMN on both databases, no table rebuild.
    op.add_column("run", sa.Column("forward_spread", sa.Float(), nullable=True))
    op.add_column("layer_time", sa.Column("op_time_spread", sa.Float(), nullable=True))
    op.add_column("run", sa.Column("stop_reason", sa.String(), nullable=True))
    _fill_spreads(op.get_bind())
    op.execute("UPDATE run SET stop_reason = 'fixed' WHERE EXISTS (SELECT 1 FROM sample s WHERE s.run_id = run.id)")
    op.execute(RUN_OP_TIME_SQL)
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    """The three columns go; the samples stay, so upgrading again computes the same spreads (SQLite
    3.35+ drops a column in place once no index or view names it)."""
    _drop_views()
    op.drop_column("layer_time", "op_time_spread")
    op.drop_column("run", "forward_spread")
    op.drop_column("run", "stop_reason")
    op.execute(RUN_OP_TIME_0005_SQL)
    op.execute(LATEST_RUN_0005_SQL)
    op.execute(RUN_SUMMARY_0005_SQL)
