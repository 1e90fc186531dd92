"""Floors at measured rates. device_ceiling holds a GPU's rates as `convsweep bench` measured them (device
copy, pinned copies each way, dense matmul per unit); every run on a GPU of that name gets its floors at
the latest (convsweep.device.floors): layer_time.floor_ms per conv layer, run.compute_floor_ms for the pass's
compute, run.forward_floor_ms for the host-to-host pass, and run.ceiling_id the rates they were reckoned at.
What the pass moves over the bus, which those floors need, is stored per run: shipped_bytes (the input in
its format), logits_bytes, tail_images (the smallest chunk: the pipeline's head and tail).

The floors the integrity checks hold times to, at the GPU's peak rates, keep their values under the name
peak_floor_ms (run.forward_floor_ms and layer_time.floor_ms were theirs until now), so that "floor" is one
thing wherever a table says "× floor".

latest_run is recreated (PostgreSQL expands its r.* when it is made), and run_summary over it, which now
carries the measured forward_floor_ms and compute_floor_ms. Their SQL is written out here so that this file
keeps its meaning whatever later files say.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
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

# 0013's: what a downgrade puts back.
RUN_SUMMARY_0013_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id,
       r.op_time_1_spread, r.op_time_2_spread, r.forward_spread, r.cache, r.note, r.error, r.checks,
       r.input_format, r.forward_floor_ms
FROM latest_run r
"""

NEW_RUN_COLUMNS = ("shipped_bytes", "logits_bytes", "tail_images", "ceiling_id", "compute_floor_ms", "forward_floor_ms")


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")


def upgrade() -> None:
    _drop_views()
    op.create_table(
        "device_ceiling",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bench_id", sa.String(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpu_uuid", sa.String(), nullable=True),
        sa.Column("hostname", sa.String(), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dtod_gbps", sa.Float(), nullable=False),
        sa.Column("h2d_gbps", sa.Float(), nullable=True),
        sa.Column("d2h_gbps", sa.Float(), nullable=True),
        sa.Column("fp32_tflops", sa.Float(), nullable=True),
        sa.Column("tf32_tflops", sa.Float(), nullable=True),
        sa.Column("fp16_tflops", sa.Float(), nullable=True),
        sa.Column("source", sa.String(), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_device_ceiling"),
        sa.UniqueConstraint("bench_id", name="uq_device_ceiling_bench_id"),
    )
    op.create_index("ix_device_ceiling_gpu", "device_ceiling", ["gpu"])
    # Both databases rename a column in place (SQLite since 3.25); the views that read these are dropped above.
    op.execute("ALTER TABLE run RENAME COLUMN forward_floor_ms TO peak_floor_ms")
    op.execute("ALTER TABLE layer_time RENAME COLUMN floor_ms TO peak_floor_ms")
    op.add_column("run", sa.Column("shipped_bytes", sa.BigInteger(), nullable=True))
    op.add_column("run", sa.Column("logits_bytes", sa.BigInteger(), nullable=True))
    op.add_column("run", sa.Column("tail_images", sa.Integer(), nullable=True))
    op.add_column("run", sa.Column("ceiling_id", sa.Integer(), nullable=True))
    op.add_column("run", sa.Column("compute_floor_ms", sa.Float(), nullable=True))
    op.add_column("run", sa.Column("forward_floor_ms", sa.Float(), nullable=True))
    op.create_index("ix_run_ceiling_id", "run", ["ceiling_id"])
    op.add_column("layer_time", sa.Column("floor_ms", sa.Float(), nullable=True))
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    _drop_views()
    op.drop_index("ix_run_ceiling_id", table_name="run")
    for column in NEW_RUN_COLUMNS:
        op.drop_column("run", column)
    op.drop_column("layer_time", "floor_ms")
    op.execute("ALTER TABLE run RENAME COLUMN peak_floor_ms TO forward_floor_ms")
    op.execute("ALTER TABLE layer_time RENAME COLUMN peak_floor_ms TO floor_ms")
    op.drop_index("ix_device_ceiling_gpu", table_name="device_ceiling")
    op.drop_table("device_ceiling")
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_0013_SQL)
