"""A job measures every tunable setting of its cell (result format 3): run gains job_key and grid,
layer_time gains params.

A format 3 result file is one job, one cell of the variant x batch x streams x host-memory matrix,
and holds one measurement per setting of the cell's tunable grid; each is still a run row of its
own. run.job_key (indexed) names the job that measured it and run.grid is where the setting sat in
that job (index, how many settings, the search); both are null for runs from format 1 and 2 files.
layer_time.params is the layer's own tunables (spec.params[layer]), so a query ranking the
settings of one layer can show them without picking them out of run.params (JSON functions differ
between SQLite and PostgreSQL). Existing rows get them from run.params, read and written in Python
so it is the same on both.

PostgreSQL expands latest_run's r.* into columns when the view is created, so latest_run (and
run_summary, which reads it) are recreated to show the new run columns, on both databases alike.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_CHUNK = 1000

# Unchanged from 0004; recreated so that r.* takes in the new columns.
LATEST_RUN_SQL = """
CREATE VIEW latest_run AS
SELECT ranked.*, o.op_time_1_ms, o.op_time_2_ms
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
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id
FROM latest_run r
"""

# Snapshots of the tables as this revision knows them (not the models, which move on). None is
# written as SQL NULL, not as JSON's 'null'.
run_table = sa.table("run", sa.column("id", sa.Integer()), sa.column("params", sa.JSON()))
layer_time_table = sa.table(
    "layer_time",
    sa.column("run_id", sa.Integer()),
    sa.column("layer", sa.String()),
    sa.column("params", sa.JSON(none_as_null=True)),
)


def _views(create: bool) -> None:
    if create:
        op.execute(LATEST_RUN_SQL)
        op.execute(RUN_SUMMARY_SQL)
    else:
        op.execute("DROP VIEW IF EXISTS run_summary")
        op.execute("DROP VIEW IF EXISTS latest_run")


def _fill_layer_params(connection: sa.Connection) -> None:
    """Each layer_time row's params: its run's params[layer] where that is an object, else null."""
    layers: dict[int, list[str]] = defaultdict(list)
    for run_id, layer in connection.execute(sa.select(layer_time_table.c.run_id, layer_time_table.c.layer)):
        layers[run_id].append(layer)
    updates: list[dict[str, Any]] = []
    for run_id, params in connection.execute(sa.select(run_table.c.id, run_table.c.params).order_by(run_table.c.id)):
        params = params if isinstance(params, dict) else {}
        for layer in layers.get(run_id, []):
            tunables = params.get(layer)
            if isinstance(tunables, dict):
                updates.append({"b_run_id": run_id, "b_layer": layer, "params": tunables})
        if len(updates) >= BACKFILL_CHUNK:
            _update(connection, updates)
    _update(connection, updates)


def _update(connection: sa.Connection, updates: list[dict[str, Any]]) -> None:
    if updates:
        connection.execute(
            sa.update(layer_time_table).where(layer_time_table.c.run_id == sa.bindparam("b_run_id"),
                                              layer_time_table.c.layer == sa.bindparam("b_layer")),
            updates)
        updates.clear()


def upgrade() -> None:
    _views(create=False)
    # Nullable columns without constraints: a plain ADD COLUMN on both databases, no table rebuild.
    op.add_column("run", sa.Column("job_key", sa.String(), nullable=True))
    op.add_column("run", sa.Column("grid", sa.JSON(), nullable=True))
    op.create_index("ix_run_job_key", "run", ["job_key"])
    op.add_column("layer_time", sa.Column("params", sa.JSON(), nullable=True))
    _fill_layer_params(op.get_bind())
    _views(create=True)


def downgrade() -> None:
    """The three columns go, and with them which job measured each run (SQLite 3.35+ drops a column
    in place once no index or view names it)."""
    _views(create=False)
    op.drop_column("layer_time", "params")
    op.drop_index("ix_run_job_key", table_name="run")
    op.drop_column("run", "grid")
    op.drop_column("run", "job_key")
    _views(create=True)
