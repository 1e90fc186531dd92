"""Per-layer times and floors, wall-time phases, prediction agreement and chunk size.

The layer_time table (one row per conv layer of a run: its variant, op time, flops and bytes
floors), so GFLOP/s and GB/s are arithmetic in SQL; the phase table (where total_s went);
run.prediction_agreement and run.chunk_images; run_summary shows the agreement.

Existing runs get their layer_time rows from the floors and op_time_ms JSON they already hold
(read and written in Python, so it is the same on SQLite and PostgreSQL). Their
prediction_agreement stays null: the database never stored it; re-ingesting cannot fill it
either (a stored run_key is left as it is), only a fresh database ingesting the files can.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_CHUNK = 1000

RUN_SUMMARY_0001_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.id AS run_id
FROM run r
"""

RUN_SUMMARY_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.id AS run_id
FROM run r
"""

# Snapshots of the tables as this revision knows them (not the models, which move on).
run_table = sa.table(
    "run",
    sa.column("id", sa.Integer()),
    sa.column("variants", sa.JSON()),
    sa.column("op_time_ms", sa.JSON()),
    sa.column("floors", sa.JSON()),
    sa.column("phases", sa.JSON()),
)
layer_time_table = sa.table(
    "layer_time",
    sa.column("run_id", sa.Integer()),
    sa.column("layer", sa.String()),
    sa.column("variant", sa.String()),
    sa.column("op_time_ms", sa.Float()),
    sa.column("flops", sa.BigInteger()),
    sa.column("bytes", sa.BigInteger()),
)
phase_table = sa.table(
    "phase",
    sa.column("run_id", sa.Integer()),
    sa.column("name", sa.String()),
    sa.column("seconds", sa.Float()),
)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def layer_rows(run_id: int, variants: Any, op_time_ms: Any, floors: Any) -> list[dict[str, Any]]:
    """The rows ingest writes for a run (convsweep.store.conv_layers and _run_row, as of 0002);
    a value ingest would refuse becomes null rather than stopping the migration."""
    variants, op_time_ms, floors = _dict(variants), _dict(op_time_ms), _dict(floors)
    layers = list(variants)
    for layer in [*floors, *op_time_ms]:
        if layer not in layers:
            layers.append(layer)
    rows = []
    for layer in layers:
        floor = _dict(floors.get(layer))
        time_ms = op_time_ms.get(layer)
        variant = variants.get(layer)
        rows.append({"run_id": run_id, "layer": layer, "variant": variant if isinstance(variant, str) else None,
                     "op_time_ms": time_ms if isinstance(time_ms, (int, float)) else None,
                     "flops": floor.get("flops") if isinstance(floor.get("flops"), int) else None,
                     "bytes": floor.get("bytes") if isinstance(floor.get("bytes"), int) else None})
    return rows


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.add_column("run", sa.Column("prediction_agreement", sa.Float(), nullable=True))
    op.add_column("run", sa.Column("chunk_images", sa.Integer(), nullable=True))
    op.create_table(
        "layer_time",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("layer", sa.String(), nullable=False),
        sa.Column("variant", sa.String(), nullable=True),
        sa.Column("op_time_ms", sa.Float(), nullable=True),
        sa.Column("flops", sa.BigInteger(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_layer_time_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "layer", name="pk_layer_time"),
    )
    op.create_table(
        "phase",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name="fk_phase_run_id_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "name", name="pk_phase"),
    )
    op.execute(RUN_SUMMARY_SQL)

    connection = op.get_bind()
    runs = connection.execute(
        sa.select(run_table.c.id, run_table.c.variants, run_table.c.op_time_ms, run_table.c.floors,
                  run_table.c.phases)
        .order_by(run_table.c.id)
    ).all()
    rows: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []
    for run_id, variants, op_time_ms, floors, run_phases in runs:
        rows.extend(layer_rows(run_id, variants, op_time_ms, floors))
        phases.extend({"run_id": run_id, "name": name, "seconds": seconds if isinstance(seconds, (int, float)) else None}
                      for name, seconds in _dict(run_phases).items())
        if len(rows) >= BACKFILL_CHUNK:
            connection.execute(sa.insert(layer_time_table), rows)
            rows = []
        if len(phases) >= BACKFILL_CHUNK:
            connection.execute(sa.insert(phase_table), phases)
            phases = []
    if rows:
        connection.execute(sa.insert(layer_time_table), rows)
    if phases:
        connection.execute(sa.insert(phase_table), phases)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.drop_table("phase")
    op.drop_table("layer_time")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of run would drop the old
    # table, and with foreign keys on that deletes every run's samples, kernels and memcpys.
    op.drop_column("run", "chunk_images")
    op.drop_column("run", "prediction_agreement")
    op.execute(RUN_SUMMARY_0001_SQL)
