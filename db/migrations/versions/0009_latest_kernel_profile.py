"""The view latest_kernel_profile: the rows of each setting's newest Nsight Compute profile (a setting
profiled again keeps its older profiles in kernel_profile). `convsweep query why` and the roofline's
measured DRAM bytes both read it, so "newest" is said once.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""
from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
CREATE VIEW latest_kernel_profile AS
SELECT kp.*
FROM kernel_profile kp
WHERE kp.profile_id = (SELECT k2.profile_id FROM kernel_profile k2 WHERE k2.run_key = kp.run_key
                       ORDER BY k2.profiled_at DESC, k2.id DESC LIMIT 1)""")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS latest_kernel_profile")
