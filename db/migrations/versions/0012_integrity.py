"""What the integrity checks (convsweep.measure.integrity) found, per run: which checks ran (run.checks: full, or
fast where the experiment turned the expensive ones off; NULL for runs without them: the CPU reference,
runs stored before), how many timed passes were checked and the first whose output was wrong, how many
saw inputs not seen earlier in the run, the caching test's ratio (repeated / fresh) and the physical
floor of the whole forward pass; per conv layer, the floor its op time was held to (layer_time.floor_ms).
A run whose numbers cannot be trusted has status `suspect` (a value, not a column: status is text) and
its reasons in error.

latest_run is recreated (PostgreSQL expands its r.* when it is made), and run_summary over it, which now
carries error (a suspect run's reasons) and checks, so the summary query can say why a row is suspect
and that a row was measured with fast checks. Their SQL is written out here so that this file keeps
its meaning whatever later files say.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
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
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note, r.error, r.checks
FROM latest_run r
"""

# 0007's, which 0010 and 0011 recreated as it was: what a downgrade puts back.
RUN_SUMMARY_0011_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id,
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note
FROM latest_run r
"""

RUN_COLUMNS = (
    ("checks", sa.String()),
    ("checked_passes", sa.Integer()),
    ("failed_pass", sa.Integer()),
    ("fresh_passes", sa.Integer()),
    ("caching_ratio", sa.Float()),
    ("forward_floor_ms", sa.Float()),
)


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")


def upgrade() -> None:
    _drop_views()
    for name, type_ in RUN_COLUMNS:
        op.add_column("run", sa.Column(name, type_, nullable=True))
    op.add_column("layer_time", sa.Column("floor_ms", sa.Float(), nullable=True))
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    _drop_views()
    op.drop_column("layer_time", "floor_ms")
    for name, _ in reversed(RUN_COLUMNS):
        op.drop_column("run", name)
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_0011_SQL)
