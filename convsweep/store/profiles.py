"""Idempotent ingest of Nsight Compute profile files (workflow/schemas/profile.schema.yaml, read as
convsweep.measure.files.ProfileFile): one kernel_profile row per profiled conv kernel launch, one transaction per
file. A skipped profile (ncu missing, or unable to profile) stores nothing and says why."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from convsweep.base.errors import StoreError
from convsweep.measure.files import ProfileFile

from .engine import _writer, storing
from .ingest_report import IngestReport
from .models import KernelProfile
from convsweep.base.strict_json import utc_time


def ingest_profile(engine: Engine, document: dict[str, Any], source: str, path: str | None = None) -> IngestReport:
    """Store a profile file checked against its schema (convsweep.store.ingest does) unless this profile
    (profile_id) is stored already. A kernel_profile row keeps no path."""
    profile = ProfileFile.from_json(document)
    report = IngestReport()
    if profile.status != "ok":
        report.skipped.append(f"{source}: no profile: {profile.reason}")
        return report
    with storing(source), Session(_writer(engine)) as session, session.begin():
        stored = session.scalar(select(KernelProfile.id).where(KernelProfile.profile_id == profile.profile_id).limit(1))
        if stored is not None:
            report.unchanged += len(profile.profiles)
            return report
        for row in _rows(profile, source):
            session.add(row)
            report.added += 1
            report.added_by_status["profiled"] += 1
    return report


def _rows(profile: ProfileFile, source: str) -> list[KernelProfile]:
    now, profiled_at = datetime.now(timezone.utc), utc_time(profile.started_at, source, "started_at")
    unplaced = profile.unplaced()
    if unplaced is not None:
        raise StoreError(f"{source}: profiles[{unplaced}].setting: {profile.profiles[unplaced].setting} "
                         "is not among its settings")
    return [KernelProfile(**columns, profiled_at=profiled_at, ingested_at=now) for columns in profile.kernel_profile_rows()]
