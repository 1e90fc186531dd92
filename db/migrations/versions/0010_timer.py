"""run.timer: how a run's timed passes were timed (the sweep axis `timer`, convsweep/base/axes.py): events
(CUDA events around each pass, and around each layer and copy) or graph (one replay of the pass
captured once as a CUDA graph, timed whole). Every run stored before was timed with events.

latest_run is recreated (PostgreSQL expands its r.* when it is made), and run_summary over it; their
SQL is 0007's, written out here so that this file keeps its meaning whatever later files say.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
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
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note
FROM latest_run r
"""


def _recreate_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")
    op.add_column("run", sa.Column("timer", sa.String(), nullable=False, server_default="events"))
    _recreate_views()


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")
    op.drop_column("run", "timer")
    _recreate_views()
