"""confirmation: each setting's verdict in a confirmation of a cell's fastest settings per conv layer, measured
again in one process, interleaved (convsweep/measure/confirm.py, workflow/schemas/confirm.schema.yaml): winner, tied
(a paired test cannot tell it from the winner), slower, or incorrect/failed; the first ranking's place beside it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "confirmation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("confirmation_id", sa.String(), nullable=False),
        sa.Column("group_id", sa.String(), nullable=False),
        sa.Column("experiment", sa.String(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("layer", sa.String(), nullable=False),
        sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(), nullable=False),
        sa.Column("params", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("first_place", sa.Integer(), nullable=False),
        sa.Column("first_ms", sa.Float(), nullable=True),
        sa.Column("place", sa.Integer(), nullable=True),
        sa.Column("standing", sa.String(), nullable=False),
        sa.Column("overturned", sa.Boolean(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("spread", sa.Float(), nullable=True),
        sa.Column("difference_ms", sa.Float(), nullable=True),
        sa.Column("p_value", sa.Float(), nullable=True),
        sa.Column("detectable_ms", sa.Float(), nullable=True),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("samples_ms", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Integer(), nullable=True),
        sa.Column("sm_clock_after_mhz", sa.Integer(), nullable=True),
        sa.Column("gpu", sa.String(), nullable=True),
        sa.Column("confirmed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_confirmation_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_confirmation"),
        sa.UniqueConstraint("confirmation_id", "layer", "run_id", name="uq_confirmation_confirmation_id_layer_run_id"),
    )
    op.create_index("ix_confirmation_confirmation_id", "confirmation", ["confirmation_id"])
    op.create_index("ix_confirmation_run_id", "confirmation", ["run_id"])


def downgrade() -> None:
    op.drop_table("confirmation")
