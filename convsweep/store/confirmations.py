"""Idempotent ingest of confirm files (workflow/schemas/confirm.schema.yaml, read as
convsweep.measure.files.ConfirmFile): one `confirmation` row per layer and setting of a confirmation, one
transaction per file. A skipped confirmation (fewer than two settings to tell apart) stores nothing and says why.
The runs it re-measured must be stored first: ingest_results reads the experiment's runs/ folder before its
winners/."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from convsweep.base.errors import StoreError
from convsweep.measure.files import ConfirmFile

from .engine import _writer, storing
from .ingest_report import IngestReport
from .models import Confirmation, Run
from convsweep.base.strict_json import utc_time


def ingest_confirmation(engine: Engine, document: dict[str, Any], source: str,
                        path: str | None = None) -> IngestReport:
    """Store a confirm file checked against its schema (convsweep.store.ingest does) unless this confirmation
    (confirmation_id) is stored already. A confirmation row keeps no path."""
    confirmation = ConfirmFile.from_json(document)
    report = IngestReport()
    if confirmation.status != "ok":
        report.skipped.append(f"{source}: not confirmed: {confirmation.reason}")
        return report
    with storing(source), Session(_writer(engine)) as session, session.begin():
        stored = session.scalar(select(Confirmation.id)
                                .where(Confirmation.confirmation_id == confirmation.confirmation_id).limit(1))
        rows = _rows(session, confirmation, source)
        if stored is not None:
            report.unchanged += len(rows)
            return report
        session.add_all(rows)
        report.added += len(rows)
        report.added_by_status["confirmed"] += len(rows)
    return report


def _rows(session: Session, confirmation: ConfirmFile, source: str) -> list[Confirmation]:
    candidates = [c.measurement_id for c in confirmation.candidates]
    runs = dict(session.execute(select(Run.measurement_id, Run.id).where(Run.measurement_id.in_(candidates)))
                .tuples().all())
    missing = sorted(set(candidates) - set(runs))
    if missing:
        raise StoreError(f"{source}: candidates: the runs it confirms are not stored ({missing[0]} and "
                         f"{len(missing) - 1} more): ingest the experiment's results first")
    now, confirmed_at = datetime.now(timezone.utc), utc_time(confirmation.started_at, source, "started_at")
    stray = confirmation.stray_entry()
    if stray is not None:
        raise StoreError(f"{source}: {stray}.measurement_id: not among its candidates")
    return [Confirmation(**columns, confirmed_at=confirmed_at, ingested_at=now)
            for columns in confirmation.confirmation_rows(runs)]
