"""The view latest_confirmation: the confirmation rows that speak for their cell today, so that `query best` and
`query winners` say "newest" once. Of each cell's confirmations of a layer the newest (confirmed_at), and only
while each run it measured again is still its setting's latest (latest_run): a setting measured again since
leaves the cell to its first ranking.

It reads latest_run, so a later revision that recreates latest_run (or rebuilds run or confirmation, as
SQLite's batch mode does) drops this view first and makes it again after, as they do run_summary. Its SQL is
written out here so that this file keeps its meaning whatever later files say.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""
from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LATEST_CONFIRMATION_SQL = """
CREATE VIEW latest_confirmation AS
WITH newest AS (
    SELECT experiment, group_id, layer_index, MAX(confirmed_at) AS confirmed_at
    FROM confirmation
    GROUP BY experiment, group_id, layer_index
)
SELECT c.*
FROM confirmation c
JOIN newest n ON n.experiment = c.experiment AND n.group_id = c.group_id AND n.layer_index = c.layer_index
             AND n.confirmed_at = c.confirmed_at
WHERE NOT EXISTS (SELECT 1 FROM confirmation o
                  WHERE o.confirmation_id = c.confirmation_id AND o.layer_index = c.layer_index
                    AND o.run_id NOT IN (SELECT id FROM latest_run))
"""


def upgrade() -> None:
    op.execute(LATEST_CONFIRMATION_SQL)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS latest_confirmation")
