"""Idempotent ingest of Nsight Compute profile files (workflow/schemas/profile.schema.yaml): one
kernel_profile row per profiled conv kernel launch, one transaction per file. A skipped profile
(ncu missing, or unable to profile) stores nothing and says why."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from convsweep.base.errors import StoreError

from .engine import _writer, storing
from .ingest_report import IngestReport
from .models import KernelProfile
from convsweep.base.strict_json import check_schema, utc_time

_COLUMNS = ("sm_pct", "memory_pct", "dram_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct",
            "waves_per_sm", "l1_hit_pct", "l2_hit_pct", "flops", "tensor_pipe_pct")
_INTEGER_COLUMNS = ("registers", "block_size", "grid_size", "dram_read_bytes", "dram_write_bytes")


def ingest_profile(engine: Engine, profile: dict[str, Any], path: str | None = None) -> IngestReport:
    """Store a profile file's launches unless this profile (profile_id) is stored already."""
    source = path or f"profile {profile.get('job_id', '?')}"
    check_schema(profile, "profile", source)
    report = IngestReport()
    if profile["status"] != "ok":
        report.skipped.append(f"{source}: no profile: {profile.get('reason')}")
        return report
    with storing(source), Session(_writer(engine)) as session, session.begin():
        stored = session.scalar(select(KernelProfile.id).where(KernelProfile.profile_id == profile["profile_id"]).limit(1))
        if stored is not None:
            report.unchanged += len(profile["profiles"])
            return report
        for row in _rows(profile, source):
            session.add(row)
            report.added += 1
            report.added_by_status["profiled"] += 1
    return report


def _rows(profile: dict[str, Any], source: str) -> list[KernelProfile]:
    job, settings = profile.get("job") or {}, {s["index"]: s for s in profile["settings"]}
    variants = job.get("variants") or {}
    now, profiled_at = datetime.now(timezone.utc), utc_time(profile.get("started_at"), source, "started_at")
    gpu = (profile.get("environment") or {}).get("gpu")
    rows = []
    for i, launch in enumerate(profile["profiles"]):
        setting = settings.get(launch["setting"])
        if setting is None:
            raise StoreError(f"{source}: profiles[{i}].setting: {launch['setting']} is not among its settings")
        metrics = launch["metrics"]
        shared = [metrics.get(k) for k in ("static_shared_bytes", "dynamic_shared_bytes")]
        rows.append(KernelProfile(
            profile_id=profile["profile_id"], run_key=setting["run_key"], job_id=profile["job_id"],
            experiment=profile["sweep"]["experiment"], variant=variants.get(launch["layer"], "?"),
            params=(setting["params"] or {}).get(launch["layer"]) or None, batch=job.get("batch", 0),
            setting=launch["setting"], layer=launch["layer"], kernel=launch["kernel"], launch=launch["launch"],
            **{k: metrics.get(k) for k in _COLUMNS},
            duration_ms=metrics["duration_ns"] / 1e6 if metrics.get("duration_ns") is not None else None,
            **{k: int(metrics[k]) if metrics.get(k) is not None else None for k in _INTEGER_COLUMNS},
            shared_bytes=int(sum(shared)) if all(v is not None for v in shared) else None,
            occupancy_limiter=launch.get("limiter"), stalls=launch["stalls"], bound=launch["bound"], metrics=metrics,
            gpu=gpu, git_commit=(profile.get("git") or {}).get("commit"), ncu=profile.get("ncu"),
            profiled_at=profiled_at, ingested_at=now))
    return rows
