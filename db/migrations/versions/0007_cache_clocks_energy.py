"""Cache state, clocks after the timed part, slowdowns and energy: what a run's numbers were
measured under (issue: numbers a skeptic accepts).

run gains:
- cache: warm or cold (L2 written over before each conv layer). Every run stored before was warm.
- sm_clock_after_mhz, memory_clock_after_mhz: NVML's clocks at the end of the timed part, beside
  sm_clock_mhz and memory_clock_mhz at its start.
- throttle_reasons (NVML's slowdown reasons seen after any timed pass, comma-separated) and
  throttled_passes (how many passes they were seen after); note, a line a reader should know
  (which passes ran with the clocks held down).
- energy_j (the GPU's energy counter over the timed part) and energy_per_pass_j.

sample gains throttled: whether the pass the sample belongs to ran with the clocks held down (null
where NVML could not tell, and for every sample stored before).

Nothing is known of these for the runs stored before, except their cache: they stay null. latest_run
is recreated (PostgreSQL expands its r.* when it is made), and run_summary ends with cache and note.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note
FROM latest_run r
"""

RUN_SUMMARY_0006_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id,
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread
FROM latest_run r
"""

RUN_COLUMNS = (
    ("sm_clock_after_mhz", sa.Integer()),
    ("memory_clock_after_mhz", sa.Integer()),
    ("throttle_reasons", sa.String()),
    ("throttled_passes", sa.Integer()),
    ("note", sa.Text()),
    ("energy_j", sa.Float()),
    ("energy_per_pass_j", sa.Float()),
)


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")
    op.execute("DROP VIEW IF EXISTS run_op_time")


def _create_views(run_summary_sql: str) -> None:
    op.execute(RUN_OP_TIME_SQL)
    op.execute(LATEST_RUN_SQL)
    op.execute(run_summary_sql)


def upgrade() -> None:
    _drop_views()
    # ADD COLUMN with a constant default fills the existing rows on both databases, no table rebuild.
    op.add_column("run", sa.Column("cache", sa.String(), nullable=False, server_default="warm"))
    for name, type_ in RUN_COLUMNS:
        op.add_column("run", sa.Column(name, type_, nullable=True))
    op.add_column("sample", sa.Column("throttled", sa.Boolean(), nullable=True))
    _create_views(RUN_SUMMARY_SQL)


def downgrade() -> None:
    """The columns go, and with them what they held: cold runs then read as the warm ones they are not."""
    _drop_views()
    op.drop_column("sample", "throttled")
    for name, _ in reversed(RUN_COLUMNS):
        op.drop_column("run", name)
    op.drop_column("run", "cache")
    _create_views(RUN_SUMMARY_0006_SQL)
