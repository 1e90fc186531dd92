"""Idempotent ingest of confirm files (workflow/schemas/confirm.schema.yaml, convsweep/measure/confirm.py): one
`confirmation` row per layer and setting of a confirmation, one transaction per file. A skipped
confirmation (fewer than two settings to tell apart) stores nothing and says why. The runs it re-measured
must be stored first: ingest_results reads the experiment's runs/ folder before its winners/."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from convsweep.base.errors import StoreError

from .engine import _writer, storing
from .ingest_report import IngestReport
from .models import Confirmation, Run
from convsweep.base.strict_json import check_schema, utc_time


def ingest_confirmation(engine: Engine, confirmation: dict[str, Any], path: str | None = None) -> IngestReport:
    """Store a confirm file's verdicts unless this confirmation (confirmation_id) is stored already."""
    source = path or f"confirmation {confirmation.get('group_id', '?')}"
    check_schema(confirmation, "confirm", source)
    report = IngestReport()
    if confirmation["status"] != "ok":
        report.skipped.append(f"{source}: not confirmed: {confirmation.get('reason')}")
        return report
    with storing(source), Session(_writer(engine)) as session, session.begin():
        stored = session.scalar(select(Confirmation.id)
                                .where(Confirmation.confirmation_id == confirmation["confirmation_id"]).limit(1))
        rows = _rows(session, confirmation, source)
        if stored is not None:
            report.unchanged += len(rows)
            return report
        session.add_all(rows)
        report.added += len(rows)
        report.added_by_status["confirmed"] += len(rows)
    return report


def _rows(session: Session, confirmation: dict[str, Any], source: str) -> list[Confirmation]:
    candidates = {c["measurement_id"]: c for c in confirmation["candidates"]}
    runs = dict(session.execute(select(Run.measurement_id, Run.id).where(Run.measurement_id.in_(candidates)))
                .tuples().all())
    missing = sorted(set(candidates) - set(runs))
    if missing:
        raise StoreError(f"{source}: candidates: the runs it confirms are not stored ({missing[0]} and "
                         f"{len(missing) - 1} more): ingest the experiment's results first")
    now, confirmed_at = datetime.now(timezone.utc), utc_time(confirmation.get("started_at"), source, "started_at")
    clocks, after = confirmation.get("clocks") or {}, confirmation.get("clocks_after") or {}
    gpu = (confirmation.get("environment") or {}).get("gpu")
    rows = []
    for i, verdict in enumerate(confirmation["layers"]):
        for j, entry in enumerate(verdict["entries"]):
            candidate = candidates.get(entry["measurement_id"])
            if candidate is None:
                raise StoreError(f"{source}: layers[{i}].entries[{j}].measurement_id: not among its candidates")
            rows.append(Confirmation(
                confirmation_id=confirmation["confirmation_id"], group_id=confirmation["group_id"],
                experiment=confirmation["experiment"], batch=confirmation["batch"], layer=verdict["layer"],
                layer_index=verdict["layer_index"], run_id=runs[entry["measurement_id"]],
                variant=(candidate.get("variants") or {}).get(verdict["layer"], candidate["variant"]), params=(candidate.get("params") or {}).get(verdict["layer"]),
                first_place=entry["first_place"], first_ms=entry.get("first_ms"), place=entry.get("place"),
                standing=entry["standing"], overturned=verdict["overturned"], median_ms=entry.get("median_ms"),
                spread=entry.get("spread"), difference_ms=entry.get("difference_ms"), p_value=entry.get("p_value"),
                detectable_ms=entry.get("detectable_ms"), rounds=len(entry["samples_ms"]),
                samples_ms=entry["samples_ms"], error=entry.get("error"), sm_clock_mhz=clocks.get("sm_mhz"),
                sm_clock_after_mhz=after.get("sm_mhz"), gpu=gpu, confirmed_at=confirmed_at, ingested_at=now))
    return rows
