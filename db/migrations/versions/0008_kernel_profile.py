"""Nsight Compute's evidence per conv kernel: the table kernel_profile, one row per profiled launch
of a setting's conv kernel (convsweep/measure/ncu.py, workflow/schemas/profile.schema.yaml). Profiles come
from jobs of their own, never the timed ones; run_key ties a profile to the setting's runs.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kernel_profile",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("profile_id", sa.String(), nullable=False),
        sa.Column("run_key", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("experiment", sa.String(), nullable=False),
        sa.Column("variant", sa.String(), nullable=False),
        sa.Column("params", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("setting", sa.Integer(), nullable=False),
        sa.Column("layer", sa.String(), nullable=False),
        sa.Column("kernel", sa.String(), nullable=False),
        sa.Column("launch", sa.Integer(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("sm_pct", sa.Float(), nullable=True),
        sa.Column("memory_pct", sa.Float(), nullable=True),
        sa.Column("dram_pct", sa.Float(), nullable=True),
        sa.Column("achieved_occupancy_pct", sa.Float(), nullable=True),
        sa.Column("theoretical_occupancy_pct", sa.Float(), nullable=True),
        sa.Column("occupancy_limiter", sa.String(), nullable=True),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("shared_bytes", sa.Integer(), nullable=True),
        sa.Column("block_size", sa.Integer(), nullable=True),
        sa.Column("grid_size", sa.BigInteger(), nullable=True),
        sa.Column("waves_per_sm", sa.Float(), nullable=True),
        sa.Column("l1_hit_pct", sa.Float(), nullable=True),
        sa.Column("l2_hit_pct", sa.Float(), nullable=True),
        sa.Column("dram_read_bytes", sa.BigInteger(), nullable=True),
        sa.Column("dram_write_bytes", sa.BigInteger(), nullable=True),
        sa.Column("flops", sa.Float(), nullable=True),
        sa.Column("tensor_pipe_pct", sa.Float(), nullable=True),
        sa.Column("stalls", sa.JSON(), nullable=True),
        sa.Column("bound", sa.String(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=True),
        sa.Column("git_commit", sa.String(), nullable=True),
        sa.Column("ncu", sa.String(), nullable=True),
        sa.Column("profiled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_kernel_profile"),
        sa.UniqueConstraint("profile_id", "setting", "layer", "kernel", "launch",
                            name="uq_kernel_profile_profile_id_setting_layer_kernel_launch"),
    )
    op.create_index("ix_kernel_profile_profile_id", "kernel_profile", ["profile_id"])
    op.create_index("ix_kernel_profile_run_key", "kernel_profile", ["run_key"])


def downgrade() -> None:
    op.drop_table("kernel_profile")
