"""Inputs no kernel has seen: what a run's kernels do that a convolution needs not (build.findings, per kernel, read
from the PTX; run.findings, one line over the run's variant builds), the seed its rounds were made from
(run.input_seed, so they can be made again) and the kernel's accuracy on its timed rounds (run.fresh_accuracy;
run.accuracy stays round 0's, comparable with the course's). NULL for every run stored before.

latest_run, run_summary and latest_confirmation are recreated over the new columns, unchanged. Their SQL is
written out here so that this file keeps its meaning whatever later files say.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note, r.error, r.checks,
       r.input_format, r.forward_floor_ms, r.compute_ms, r.compute_floor_ms
FROM latest_run r
"""

LATEST_CONFIRMATION_SQL = """
CREATE VIEW latest_confirmation AS
WITH newest AS (
    SELECT experiment, group_id, layer_index, MAX(confirmed_at) AS confirmed_at
    FROM confirmation
    GROUP BY experiment, group_id, layer_index
)
SELECT c.*
FROM confirmation c
JOIN newest n ON n.experiment = c.experiment AND n.group_id = c.group_id AND n.layer_index = c.layer_index
             AND n.confirmed_at = c.confirmed_at
WHERE NOT EXISTS (SELECT 1 FROM confirmation o
                  WHERE o.confirmation_id = c.confirmation_id AND o.layer_index = c.layer_index
                    AND o.run_id NOT IN (SELECT id FROM latest_run))
"""

RUN_COLUMNS = (("findings", sa.Text()), ("input_seed", sa.String()), ("fresh_accuracy", sa.Float()))


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS latest_confirmation")
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")


def _make_views() -> None:
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)
    op.execute(LATEST_CONFIRMATION_SQL)


def upgrade() -> None:
    _drop_views()
    for name, kind in RUN_COLUMNS:
        op.add_column("run", sa.Column(name, kind, nullable=True))
    op.add_column("build", sa.Column("findings", sa.JSON(none_as_null=True), nullable=True))
    _make_views()


def downgrade() -> None:
    _drop_views()
    op.drop_column("build", "findings")
    for name, _ in reversed(RUN_COLUMNS):
        op.drop_column("run", name)
    _make_views()
