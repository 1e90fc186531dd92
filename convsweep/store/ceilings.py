"""A GPU's measured rates in the store, and the floors of its runs at them (convsweep.device.floors).

`convsweep bench` measures the rates (its JSON's `ceilings`: convsweep.measure.files.BenchFile); ingesting
that file stores one device_ceiling row and reckons the floors of every stored run on a GPU of that name again.
A run ingested later gets its floors from the latest row of its GPU, when there is one.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, selectinload

from convsweep.base.errors import StoreError
from convsweep.device.floors import UNITS, Ceiling, Work, compute_floor_ms, forward_floor_ms, work_floor_ms
from convsweep.measure.files import BenchFile

from .engine import _writer, storing
from .ingest_report import IngestReport
from .models import DeviceCeiling, Environment, LayerTime, Run
from convsweep.base.strict_json import check_values, utc_time


def ingest_ceiling(engine: Engine, bench: dict[str, Any], path: str | None = None) -> IngestReport:
    """Store a bench file's rates (`convsweep bench --db`: what ingest does with its --json file)."""
    source = path or f"bench {bench.get('bench_id', '?')}"
    check_values(bench, source)
    return store_ceiling(engine, bench, source)


def store_ceiling(engine: Engine, bench: dict[str, Any], source: str, path: str | None = None) -> IngestReport:
    """Store a bench file whose values are checked (strict_json.check_values) unless its rates are stored
    already (its bench_id), then reckon the floors of every run on its GPU at them. A device_ceiling row keeps
    `source`, not `path`."""
    row = _ceiling_row(bench, source)
    report = IngestReport()
    with storing(source), Session(_writer(engine)) as session, session.begin():
        if session.scalar(select(DeviceCeiling.id).where(DeviceCeiling.bench_id == row.bench_id)) is not None:
            report.unchanged += 1
            return report
        session.add(row)
        session.flush()
        refresh_floors(session, row.gpu)
        report.added += 1
        report.added_by_status["ceiling"] += 1
    return report


def _ceiling_row(bench: dict[str, Any], source: str) -> DeviceCeiling:
    """The device_ceiling row of a bench file; StoreError naming the key that is missing or wrong."""
    if not isinstance(bench.get("ceilings"), dict):
        raise StoreError(f"{source}: ceilings: expected the measured rates, as `convsweep bench --json` writes them")
    record = BenchFile.from_json(bench)
    assert record.ceilings is not None  # an object, just checked
    columns = record.ceiling_columns()

    def need(column: str, what: str) -> Any:
        key, value = columns[column]
        if value is None or value == "":
            raise StoreError(f"{source}: {key}: expected {what}, as `convsweep bench --json` writes it")
        return value

    need("dtod_gbps", "the device copy rate")
    rates = {column: _rate(value, key, source) for column, (key, value) in record.ceilings.rate_columns().items()}
    return DeviceCeiling(
        bench_id=str(need("bench_id", "the bench run's id")), gpu=str(need("gpu", "the GPU's name")),
        gpu_uuid=columns["gpu_uuid"][1], hostname=columns["hostname"][1],
        measured_at=utc_time(need("measured_at", "when it was measured"), source, "measured_at"),
        source=source, ingested_at=datetime.now(timezone.utc), **rates)


def _rate(value: Any, key: str, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise StoreError(f"{source}: {key}: expected a positive rate, got {value!r}")
    return float(value)


def latest_ceiling(session: Session, gpu: str | None) -> DeviceCeiling | None:
    """The latest rates measured on a GPU of this name."""
    if gpu is None:
        return None
    return session.scalars(select(DeviceCeiling).where(DeviceCeiling.gpu == gpu)
                           .order_by(DeviceCeiling.measured_at.desc(), DeviceCeiling.id.desc()).limit(1)).first()


def as_ceiling(row: DeviceCeiling) -> Ceiling:
    """A device_ceiling row as convsweep.device.floors takes it (bytes and FLOPs per second)."""
    flops = {unit: getattr(row, f"{unit}_tflops") * 1e12 for unit in UNITS if getattr(row, f"{unit}_tflops")}
    return Ceiling(row.gpu, row.dtod_gbps * 1e9, row.h2d_gbps * 1e9 if row.h2d_gbps else None,
                   row.d2h_gbps * 1e9 if row.d2h_gbps else None, flops)


def set_floors(run: Run, layer_times: list[LayerTime], row: DeviceCeiling | None) -> None:
    """Fill the run's and its layers' floors at `row`'s rates (clear them without one): each conv
    layer's work, the compute of them all, and the host-to-host pass over the run's chunks."""
    ceiling = as_ceiling(row) if row is not None else None
    works = {layer: Work(work.get("bytes"), work.get("flops"), work.get("unit"))
             for layer, work in (run.floors or {}).items() if isinstance(work, dict)}
    for lt in layer_times:
        lt.floor_ms = work_floor_ms(ceiling, works[lt.layer]) if ceiling and lt.layer in works else None
    compute = compute_floor_ms(ceiling, works.values()) if ceiling else None
    tail = run.tail_images / run.batch if run.tail_images and run.batch else 1.0
    run.ceiling_id = row.id if row is not None else None
    run.compute_floor_ms = compute
    run.forward_floor_ms = forward_floor_ms(ceiling, run.shipped_bytes, run.logits_bytes, compute, tail) if ceiling else None


def refresh_floors(session: Session, gpu: str) -> int:
    """Reckon the floors of every stored run on a GPU of this name at its latest rates; how many."""
    row = latest_ceiling(session, gpu)
    runs = session.scalars(select(Run).join(Environment, Environment.id == Run.environment_id)
                           .where(Environment.gpu == gpu).options(selectinload(Run.layer_times))).all()
    for run in runs:
        set_floors(run, run.layer_times, row)
    return len(runs)
