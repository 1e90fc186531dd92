"""Initial schema.

Sweeps, environments, builds, runs and their samples, kernels and memcpys, and the run_summary
view in the seeds' report shape.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_SUMMARY_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.id AS run_id
FROM run r
"""


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment", sa.String(), nullable=False),
        sa.Column("config_hash", sa.String(), nullable=False),
        sa.Column("config_path", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sweep"),
        sa.UniqueConstraint("experiment", "config_hash", name="uq_sweep_experiment_config_hash"),
    )
    op.create_table(
        "environment",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("env_hash", sa.String(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=True),
        sa.Column("gpu", sa.String(), nullable=True),
        sa.Column("compute_capability", sa.String(), nullable=True),
        sa.Column("driver", sa.String(), nullable=True),
        sa.Column("nvrtc", sa.String(), nullable=True),
        sa.Column("nsys", sa.String(), nullable=True),
        sa.Column("python", sa.String(), nullable=True),
        sa.Column("packages", sa.JSON(), nullable=True),
        sa.Column("git_commit", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_environment"),
        sa.UniqueConstraint("env_hash", name="uq_environment_env_hash"),
    )
    op.create_table(
        "build",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("build_key", sa.String(), nullable=False),
        sa.Column("variant", sa.String(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("arch", sa.String(), nullable=True),
        sa.Column("options_hash", sa.String(), nullable=True),
        sa.Column("source_hash", sa.String(), nullable=True),
        sa.Column("compile_ms", sa.Float(), nullable=True),
        sa.Column("cache_hit", sa.Boolean(), nullable=True),
        sa.Column("log", sa.Text(), nullable=True),
        sa.Column("kernels", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_build"),
        sa.UniqueConstraint("build_key", name="uq_build_build_key"),
    )
    op.create_table(
        "run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_key", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("experiment", sa.String(), nullable=False),
        sa.Column("network", sa.String(), nullable=False),
        sa.Column("dataset", sa.String(), nullable=True),
        sa.Column("variants", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("variant", sa.String(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("streams", sa.Integer(), nullable=False),
        sa.Column("host_memory", sa.String(), nullable=False),
        sa.Column("repeats", sa.Integer(), nullable=True),
        sa.Column("warmup", sa.Integer(), nullable=True),
        sa.Column("profiler_requested", sa.String(), nullable=True),
        sa.Column("profiler", sa.String(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("accuracy", sa.Float(), nullable=True),
        sa.Column("max_rel_err", sa.Float(), nullable=True),
        sa.Column("tolerance", sa.Float(), nullable=True),
        sa.Column("images_unique", sa.Integer(), nullable=True),
        sa.Column("cycled", sa.Boolean(), nullable=True),
        sa.Column("op_time_1_ms", sa.Float(), nullable=True),
        sa.Column("op_time_2_ms", sa.Float(), nullable=True),
        sa.Column("op_time_ms", sa.JSON(), nullable=True),
        sa.Column("h2d_ms", sa.Float(), nullable=True),
        sa.Column("d2h_ms", sa.Float(), nullable=True),
        sa.Column("compute_ms", sa.Float(), nullable=True),
        sa.Column("forward_ms", sa.Float(), nullable=True),
        sa.Column("overlap", sa.Float(), nullable=True),
        sa.Column("total_s", sa.Float(), nullable=True),
        sa.Column("compile_ms", sa.Float(), nullable=True),
        sa.Column("phases", sa.JSON(), nullable=True),
        sa.Column("floors", sa.JSON(), nullable=True),
        sa.Column("files", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("result_path", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(["environment_id"], ["environment.id"], name="fk_run_environment_id_environment"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweep.id"], name="fk_run_sweep_id_sweep"),
        sa.PrimaryKeyConstraint("id", name="pk_run"),
        sa.UniqueConstraint("run_key", name="uq_run_run_key"),
    )
    op.create_index("ix_run_environment_id", "run", ["environment_id"])
    op.create_index("ix_run_sweep_id", "run", ["sweep_id"])
    op.create_index("ix_run_experiment_variant_batch_streams", "run", ["experiment", "variant", "batch", "streams"])
    op.create_table(
        "run_build",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["build_id"], ["build.id"], name="fk_run_build_build_id_build", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_run_build_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "build_id", name="pk_run_build"),
    )
    op.create_index("ix_run_build_build_id", "run_build", ["build_id"])
    op.create_table(
        "sample",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("layer", sa.String(), nullable=True),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_sample_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_sample"),
    )
    op.create_index("ix_sample_run_id", "sample", ["run_id"])
    op.create_table(
        "kernel",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("layer", sa.String(), nullable=True),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("launches", sa.Integer(), nullable=True),
        sa.Column("total_ms", sa.Float(), nullable=True),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("grid", sa.JSON(), nullable=True),
        sa.Column("block", sa.JSON(), nullable=True),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("static_shared_bytes", sa.Integer(), nullable=True),
        sa.Column("dynamic_shared_bytes", sa.Integer(), nullable=True),
        sa.Column("local_bytes", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_kernel_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_kernel"),
    )
    op.create_index("ix_kernel_run_id", "kernel", ["run_id"])
    op.create_table(
        "memcpy",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("total_ms", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_memcpy_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_memcpy"),
    )
    op.create_index("ix_memcpy_run_id", "memcpy", ["run_id"])
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    for table in ("memcpy", "kernel", "sample", "run_build", "run", "build", "environment", "sweep"):
        op.drop_table(table)
