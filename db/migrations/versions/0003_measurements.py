"""Measurements: a job measured again is a new run row, and every row says what it came from.

run.run_key (the hash of a job's settings) is no longer unique; run.measurement_id is (a result
file's own id; for rows stored before, their run_key, which named their one measurement). New
provenance columns on run: source_hash and sources (the kernel code measured), git_commit and
git_dirty (moved from environment, where a new commit made a new environment), and the SM and
memory clocks at the start of the timed part. environment gains gpu_uuid and cuda_driver.

Views: latest_run (the newest measurement of each job), and run_summary over it, now with the
job id and when it was measured.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Newest first: when it was measured, then the order it was stored in (NULLS LAST on both databases).
LATEST_RUN_SQL = """
CREATE VIEW latest_run AS
SELECT ranked.*
FROM (SELECT r.*,
             ROW_NUMBER() OVER (PARTITION BY r.run_key
                                ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
      FROM run r) ranked
WHERE ranked.measurement_rank = 1
"""

RUN_SUMMARY_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id
FROM latest_run r
"""

RUN_SUMMARY_0002_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.id AS run_id
FROM run r
"""

NEW_RUN_COLUMNS = {"source_hash": sa.String, "sources": sa.JSON, "git_commit": sa.String, "git_dirty": sa.Boolean,
                   "sm_clock_mhz": sa.Integer, "memory_clock_mhz": sa.Integer}


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")


def upgrade() -> None:
    _drop_views()
    # SQLite rebuilds the table for the constraint changes (open_store turns foreign keys off
    # around migrations, so the rebuild keeps every child row).
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("measurement_id", sa.String(), nullable=True))
        for name, kind in NEW_RUN_COLUMNS.items():
            batch.add_column(sa.Column(name, kind(), nullable=True))
        batch.drop_constraint("uq_run_run_key", type_="unique")
    op.execute("UPDATE run SET measurement_id = run_key")
    op.execute("UPDATE run SET git_commit = (SELECT e.git_commit FROM environment e WHERE e.id = run.environment_id)")
    with op.batch_alter_table("run") as batch:
        batch.alter_column("measurement_id", existing_type=sa.String(), nullable=False)
        batch.create_unique_constraint("uq_run_measurement_id", ["measurement_id"])
        batch.create_index("ix_run_run_key", ["run_key"])
    op.add_column("environment", sa.Column("gpu_uuid", sa.String(), nullable=True))
    op.add_column("environment", sa.Column("cuda_driver", sa.String(), nullable=True))
    op.drop_column("environment", "git_commit")  # plain DROP COLUMN: no constraint names it
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    """Back to one row per job: the latest measurement of each is kept, older ones are deleted."""
    _drop_views()
    op.execute("""
        DELETE FROM run WHERE id NOT IN (
            SELECT id FROM (SELECT r.id, ROW_NUMBER() OVER (PARTITION BY r.run_key
                                ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS place FROM run r) ranked
            WHERE place = 1)
    """)
    op.add_column("environment", sa.Column("git_commit", sa.String(), nullable=True))
    op.execute("UPDATE environment SET git_commit = (SELECT MAX(r.git_commit) FROM run r WHERE r.environment_id = environment.id)")
    op.drop_column("environment", "cuda_driver")
    op.drop_column("environment", "gpu_uuid")
    with op.batch_alter_table("run") as batch:
        batch.drop_index("ix_run_run_key")
        batch.drop_constraint("uq_run_measurement_id", type_="unique")
        batch.create_unique_constraint("uq_run_run_key", ["run_key"])
        for name in reversed(NEW_RUN_COLUMNS):
            batch.drop_column(name)
        batch.drop_column("measurement_id")
    op.execute(RUN_SUMMARY_0002_SQL)
