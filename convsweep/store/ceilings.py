"""A GPU's measured rates in the store, and the floors of its runs at them (convsweep.device.floors).

`convsweep bench` measures the rates (its JSON's `ceilings`); ingesting that file stores one
device_ceiling row and reckons the floors of every stored run on a GPU of that name again. A run
ingested later gets its floors from the latest row of its GPU, when there is one.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, selectinload

from convsweep.base.errors import StoreError
from convsweep.device.floors import UNITS, Ceiling, Work, compute_floor_ms, forward_floor_ms, work_floor_ms

from .engine import _writer, storing
from .ingest_report import IngestReport
from .models import DeviceCeiling, Environment, LayerTime, Run
from convsweep.base.strict_json import check_values, utc_time

BENCH_FORMAT = "bench-2"  # convsweep.bench.report.BENCH_FORMAT, named here so ingest never imports the bench


def ingest_ceiling(engine: Engine, bench: dict[str, Any], path: str | None = None) -> IngestReport:
    """Store a bench file's rates unless they are stored already (its bench_id), then reckon the
    floors of every run on its GPU at them."""
    source = path or f"bench {bench.get('bench_id', '?')}"
    check_values(bench, source)
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
    def need(value, key: str, what: str):
        if value is None or value == "":
            raise StoreError(f"{source}: {key}: expected {what}, as `convsweep bench --json` writes it")
        return value

    ceilings = bench.get("ceilings")
    if not isinstance(ceilings, dict):
        raise StoreError(f"{source}: ceilings: expected the measured rates, as `convsweep bench --json` writes them")
    environment = cast(dict, bench.get("environment")) if isinstance(bench.get("environment"), dict) else {}
    matmul = ceilings.get("matmul_TFLOPps") or {}
    rates = {"dtod_gbps": _rate(need(ceilings.get("dtod_GBps"), "ceilings.dtod_GBps", "the device copy rate"),
                                "ceilings.dtod_GBps", source)}
    for column, key in (("h2d_gbps", "h2d_GBps"), ("d2h_gbps", "d2h_GBps")):
        rates[column] = _rate(ceilings.get(key), f"ceilings.{key}", source)
    for unit in UNITS:
        rates[f"{unit}_tflops"] = _rate(matmul.get(unit), f"ceilings.matmul_TFLOPps.{unit}", source)
    return DeviceCeiling(
        bench_id=str(need(bench.get("bench_id"), "bench_id", "the bench run's id")),
        gpu=str(need(bench.get("device"), "device", "the GPU's name")), gpu_uuid=environment.get("gpu_uuid"),
        hostname=environment.get("hostname"),
        measured_at=utc_time(need(bench.get("measured_at"), "measured_at", "when it was measured"), source, "measured_at"),
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
