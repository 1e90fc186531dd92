"""Per-layer op times are stored in layer_time only: it gains layer_index, and run loses
op_time_1_ms, op_time_2_ms (LeNet's two convs) and op_time_ms (a JSON copy of the same numbers).

layer_index is a layer's 0-based position among its run's conv layers (spec.variants in network
order, then any layer only its op times or floors name), so the seeds' "op time 1" and "op time
2" are positions 0 and 1. The new view run_op_time computes them from layer_time; latest_run
(and so run_summary) and the history query read them from it, under the same names.

Existing runs get their positions from the JSON they hold, in the order ingest used for the old
columns (spec.variants, or the op times' layers when it was empty), read and written in Python
so it is the same on SQLite and PostgreSQL. A layer that JSON names without a layer_time row gets
one, and where op_time_1_ms or op_time_2_ms holds a time, positions 0 and 1 take it before the
columns go, so every view shows the op times it showed before. The downgrade restores the three
columns from layer_time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_CHUNK = 1000
OLD_COLUMNS = ("op_time_1_ms", "op_time_2_ms")  # positions 0 and 1

RUN_OP_TIME_SQL = """
CREATE VIEW run_op_time AS
SELECT r.id AS run_id, lt1.op_time_ms AS op_time_1_ms, lt2.op_time_ms AS op_time_2_ms
FROM run r
LEFT JOIN layer_time lt1 ON lt1.run_id = r.id AND lt1.layer_index = 0
LEFT JOIN layer_time lt2 ON lt2.run_id = r.id AND lt2.layer_index = 1
"""

# Newest first: when it was measured, then the order it was stored in (NULLS LAST on both databases).
LATEST_RUN_SQL = """
CREATE VIEW latest_run AS
SELECT ranked.*, o.op_time_1_ms, o.op_time_2_ms
FROM (SELECT r.*,
             ROW_NUMBER() OVER (PARTITION BY r.run_key
                                ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
      FROM run r) ranked
JOIN run_op_time o ON o.run_id = ranked.id
WHERE ranked.measurement_rank = 1
"""

LATEST_RUN_0003_SQL = """
CREATE VIEW latest_run AS
SELECT ranked.*
FROM (SELECT r.*,
             ROW_NUMBER() OVER (PARTITION BY r.run_key
                                ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
      FROM run r) ranked
WHERE ranked.measurement_rank = 1
"""

# Unchanged from 0003; recreated because latest_run under it is.
RUN_SUMMARY_SQL = """
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, r.batch, r.streams, r.host_memory, r.status,
       r.op_time_1_ms, r.op_time_2_ms, r.forward_ms, r.total_s, r.accuracy, r.max_rel_err,
       r.profiler, r.prediction_agreement, r.job_id, r.started_at, r.id AS run_id
FROM latest_run r
"""

# Snapshots of the tables as this revision knows them (not the models, which move on).
run_table = sa.table(
    "run",
    sa.column("id", sa.Integer()),
    sa.column("variants", sa.JSON()),
    sa.column("floors", sa.JSON()),
    sa.column("op_time_ms", sa.JSON()),
    sa.column("op_time_1_ms", sa.Float()),
    sa.column("op_time_2_ms", sa.Float()),
)
layer_time_table = sa.table(
    "layer_time",
    sa.column("run_id", sa.Integer()),
    sa.column("layer", sa.String()),
    sa.column("layer_index", sa.Integer()),
    sa.column("variant", sa.String()),
    sa.column("op_time_ms", sa.Float()),
    sa.column("flops", sa.BigInteger()),
    sa.column("bytes", sa.BigInteger()),
)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def layer_order(variants: Any, op_time_ms: Any, floors: Any, stored: Sequence[str]) -> list[str]:
    """A run's conv layers in layer_index order (convsweep.store.conv_layers, as of 0004): those of
    spec.variants, then the other layers its op times name (the old columns' layers when
    spec.variants was empty), its floors, and any that only layer_time names."""
    layers = list(_dict(variants))
    for layer in [*_dict(op_time_ms), *_dict(floors), *sorted(stored)]:
        if layer not in layers:
            layers.append(layer)
    return layers


def _flush(connection: sa.Connection, positions: list[dict[str, Any]], missing: list[dict[str, Any]]) -> None:
    if positions:
        connection.execute(
            sa.update(layer_time_table).where(layer_time_table.c.run_id == sa.bindparam("b_run_id"),
                                              layer_time_table.c.layer == sa.bindparam("b_layer")),
            positions)
        positions.clear()
    if missing:
        connection.execute(sa.insert(layer_time_table), missing)
        missing.clear()


def _fill_layer_index(connection: sa.Connection) -> None:
    """Number every run's layer_time rows. A layer the run's JSON names without a row gets one
    (as 0002 wrote them); the old columns' times win where layer_time lacks or differs from them."""
    stored: dict[int, dict[str, Any]] = defaultdict(dict)
    for run_id, layer, time_ms in connection.execute(
            sa.select(layer_time_table.c.run_id, layer_time_table.c.layer, layer_time_table.c.op_time_ms)):
        stored[run_id][layer] = time_ms
    runs = connection.execute(
        sa.select(run_table.c.id, run_table.c.variants, run_table.c.op_time_ms, run_table.c.floors,
                  *(run_table.c[name] for name in OLD_COLUMNS))
        .order_by(run_table.c.id))
    positions: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    for run_id, variants, op_time_ms, floors, *old_times in runs:
        rows = stored.get(run_id, {})
        layers = layer_order(variants, op_time_ms, floors, list(rows))
        times = {**{layer: _number(t) for layer, t in _dict(op_time_ms).items()}, **rows}
        for index, time_ms in enumerate(old_times):
            if time_ms is None:
                continue
            while len(layers) <= index:  # no layer name left to give it: name the position
                layers.append(f"op time {len(layers) + 1}")
            times[layers[index]] = time_ms
        for index, layer in enumerate(layers):
            if layer in rows:
                positions.append({"b_run_id": run_id, "b_layer": layer, "layer_index": index,
                                  "op_time_ms": times[layer]})
            else:
                floor = _dict(_dict(floors).get(layer))
                variant = _dict(variants).get(layer)
                missing.append({"run_id": run_id, "layer": layer, "layer_index": index,
                                "variant": variant if isinstance(variant, str) else None,
                                "op_time_ms": times.get(layer), "flops": _int(floor.get("flops")),
                                "bytes": _int(floor.get("bytes"))})
        if len(positions) + len(missing) >= BACKFILL_CHUNK:
            _flush(connection, positions, missing)
    _flush(connection, positions, missing)


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS run_summary")
    op.execute("DROP VIEW IF EXISTS latest_run")
    op.execute("DROP VIEW IF EXISTS run_op_time")


def upgrade() -> None:
    _drop_views()
    op.add_column("layer_time", sa.Column("layer_index", sa.Integer(), nullable=True))
    _fill_layer_index(op.get_bind())
    # SQLite rebuilds both tables (open_store turns foreign keys off around migrations, so the
    # rebuild of run keeps every child row).
    with op.batch_alter_table("layer_time") as batch:
        batch.alter_column("layer_index", existing_type=sa.Integer(), nullable=False)
        batch.create_unique_constraint("uq_layer_time_run_id_layer_index", ["run_id", "layer_index"])
    with op.batch_alter_table("run") as batch:
        batch.drop_column("op_time_ms")
        for name in reversed(OLD_COLUMNS):
            batch.drop_column(name)
    op.execute(RUN_OP_TIME_SQL)
    op.execute(LATEST_RUN_SQL)
    op.execute(RUN_SUMMARY_SQL)


def downgrade() -> None:
    """The columns again, from layer_time: positions 0 and 1, and op_time_ms as the object of
    every layer's time (null ones too) in position order; null for a run without layers."""
    _drop_views()
    with op.batch_alter_table("run") as batch:
        for name in OLD_COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch.add_column(sa.Column("op_time_ms", sa.JSON(), nullable=True))
    connection = op.get_bind()
    per_run: dict[int, dict[str, Any]] = {}
    for run_id, index, layer, time_ms in connection.execute(
            sa.select(layer_time_table.c.run_id, layer_time_table.c.layer_index, layer_time_table.c.layer,
                      layer_time_table.c.op_time_ms)
            .order_by(layer_time_table.c.run_id, layer_time_table.c.layer_index)):
        row = per_run.setdefault(run_id, {"b_id": run_id, **dict.fromkeys(OLD_COLUMNS), "op_time_ms": {}})
        row["op_time_ms"][layer] = time_ms
        if index < len(OLD_COLUMNS):
            row[OLD_COLUMNS[index]] = time_ms
    updates = list(per_run.values())
    for start in range(0, len(updates), BACKFILL_CHUNK):
        connection.execute(sa.update(run_table).where(run_table.c.id == sa.bindparam("b_id")),
                           updates[start:start + BACKFILL_CHUNK])
    with op.batch_alter_table("layer_time") as batch:
        batch.drop_constraint("uq_layer_time_run_id_layer_index", type_="unique")
        batch.drop_column("layer_index")
    op.execute(LATEST_RUN_0003_SQL)
    op.execute(RUN_SUMMARY_SQL)
