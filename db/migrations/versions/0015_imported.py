"""run.imported_from: where a run read from another tool's file came from (`convsweep import` of a Kernel
Tuner cache, convsweep/app/kerneltuner.py); NULL for every run measured here, so every run stored before is one.

latest_run is recreated (PostgreSQL expands its r.* when it is made), and run_summary over it, unchanged.
Their SQL is written out here so that this file keeps its meaning whatever later files say.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
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

# 0014's, which this revision keeps: what both an upgrade and a downgrade put back.
RUN_SUMMARY_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id,
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note, r.error, r.checks,
       r.input_format, r.forward_floor_ms, r.compute_ms, r.compute_floor_ms
FROM latest_run r
"""


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")


def upgrade() -> None:
    _drop_views()
    op.add_column("run", sa.Column("imported_from", sa.String(), nullable=True))
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    _drop_views()
    op.drop_column("run", "imported_from")
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)
