"""Idempotent ingest of per-job result JSON files (workflow/schemas/result.schema.yaml, explained
in docs/result-format.md): one transaction per file, nothing half-stored. A file holds one
measurement (formats 1 and 2) or one per tunable setting of its job (format 3); each is a run row."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from convsweep.config import variant_label
from convsweep.errors import ConfigError, StoreError, StoreUnavailable
from convsweep.fileio import canonical_hash
from convsweep.progress import progress
from convsweep.schema import validate
from convsweep.stats import relative_spread

from .engine import _writer, one_line, storing
from .ingest_report import IngestReport
from .models import Base, Build, Environment, KernelStat, LayerTime, Memcpy, Phase, Run, Sample, Sweep
from .profiles import ingest_profile
from .strict_json import check_values, read_json, utc_time


PROFILE_FORMAT = "ncu-1"  # convsweep.ncu.FORMAT, named here so ingest never imports the profiler

# Transactions per file when another writer stores some of its measurements between our check and
# our insert (that insert fails; the next attempt sees them stored and skips them).
RACE_ATTEMPTS = 3


def build_key(build: dict[str, Any]) -> str:
    return canonical_hash({k: build.get(k) for k in ("variant", "params", "arch", "options_hash", "source_hash")})


def check_result(result: Any, source: str) -> None:
    """Raise StoreError naming the file and key when a result does not match the result schema or
    holds a number no column can (NaN and infinities, which JSON Schema cannot see)."""
    check_values(result, source)
    try:
        validate(result, "result", source, fill_defaults=False)
    except ConfigError as exc:
        raise StoreError(str(exc)) from None


def _get_or_create(session: Session, model: type[Base], keys: dict[str, Any], values: dict[str, Any]) -> int:
    """The id of the row with these key columns, inserted if missing; safe against concurrent inserts.
    Remembered for the session's transaction: a file's settings share their sweep, environment and
    layers build, which would otherwise cost two statements per setting each."""
    known = session.info.setdefault("ids", {})
    memo_key = (model.__tablename__, tuple(sorted(keys.items())))
    if memo_key not in known:
        known[memo_key] = _find_or_insert(session, model, keys, values)
    return known[memo_key]


def _find_or_insert(session: Session, model: type[Base], keys: dict[str, Any], values: dict[str, Any]) -> int:
    dialect = session.get_bind().dialect.name
    row = {**values, **keys}
    if dialect in ("postgresql", "sqlite"):
        insert_fn = pg_insert if dialect == "postgresql" else sqlite_insert
        session.execute(insert_fn(model).values(row).on_conflict_do_nothing(index_elements=list(keys)))
    else:
        found = session.scalar(select(model.id).filter_by(**keys))
        if found is not None:
            return found
        session.execute(insert(model).values(row))
    return session.scalar(select(model.id).filter_by(**keys))


def measurement_id(result: dict[str, Any]) -> str:
    """What names one measurement: its own id, or for format 1 (one measurement per job) the run_key."""
    return result["run_key"] if result.get("format") == 1 else result["measurement_id"]


def measurements(result: dict[str, Any], source: str) -> list[tuple[str, dict[str, Any]]]:
    """(key path prefix, measurement) of each measurement of a checked result file: a format 3
    file's `measurements`, else the file itself. StoreError when two share a measurement id or
    one names another job than the file's."""
    if result["format"] != 3:
        return [("", result)]
    found: list[tuple[str, dict[str, Any]]] = []
    first_at: dict[str, int] = {}
    for index, measurement in enumerate(result["measurements"]):
        where = f"measurements[{index}]."
        key = measurement["measurement_id"]
        if key in first_at:
            raise StoreError(f"{source}: {where}measurement_id: {key!r} is measurements[{first_at[key]}]'s too")
        first_at[key] = index
        if measurement["grid"]["job_key"] != result["job_key"]:
            raise StoreError(f"{source}: {where}grid.job_key: expected the file's job_key {result['job_key']!r}, "
                             f"got {measurement['grid']['job_key']!r}")
        found.append((where, measurement))
    return found


def ingest_result(engine: Engine, result: dict[str, Any], result_path: str | None = None) -> IngestReport:
    """Store one result file in one transaction: each of its measurements not stored yet becomes a
    run row, or, when anything fails, none does. A new measurement of a stored setting is a new
    row beside the old ones; one already stored counts as unchanged."""
    if isinstance(result, dict) and result.get("format") == PROFILE_FORMAT:  # an Nsight Compute profile job's file
        check_values(result, result_path or f"profile {result.get('job_id', '?')}")
        return ingest_profile(engine, result, result_path)
    source = result_path or f"result {result.get('job_id', '?') if isinstance(result, dict) else '?'}"
    check_result(result, source)
    found = measurements(result, source)
    keys = [measurement_id(m) for _, m in found]
    attempts = 0
    with storing(source):
        while True:
            attempts += 1
            try:
                return _store(engine, found, keys, result_path, source)
            except IntegrityError as exc:
                # Another writer may have stored some of them between our check and our insert: look again.
                with Session(engine) as session:
                    raced = bool(_stored_ids(session, keys))
                if not raced or attempts == RACE_ATTEMPTS:
                    raise StoreError(f"cannot store {source}: {one_line(exc)}") from None


def _stored_ids(session: Session, keys: list[str]) -> set[str]:
    """Those of `keys` that name a stored measurement."""
    return set(session.scalars(select(Run.measurement_id).where(Run.measurement_id.in_(keys))))


def _store(engine: Engine, found: list[tuple[str, dict[str, Any]]], keys: list[str], result_path: str | None,
           source: str) -> IngestReport:
    """One transaction: a run row for each measurement not stored yet."""
    report = IngestReport()
    with Session(_writer(engine)) as session, session.begin():
        stored = _stored_ids(session, keys)
        for (where, measurement), key in zip(found, keys):
            if key in stored:
                report.unchanged += 1
                continue
            session.add(_run_row(session, measurement, result_path, source, where))
            report.added += 1
            report.added_by_status[measurement["status"]] += 1
    return report


def conv_layers(variants: dict[str, Any], floors: dict[str, Any], op_time_ms: dict[str, Any]) -> list[str]:
    """The run's conv layers in layer_index order: those of spec.variants in network order, then
    any other layer that only its op times or floors name."""
    layers = list(variants)
    for layer in [*op_time_ms, *floors]:
        if layer not in layers:
            layers.append(layer)
    return layers


def _sample_spreads(samples: list[dict[str, Any]]) -> dict[tuple[str, str | None], float | None]:
    """(metric, layer) -> the relative spread of its samples (convsweep.stats.relative_spread)."""
    values: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    for sample in samples:
        values[(sample.get("metric"), sample.get("layer"))].append(sample.get("value"))
    return {key: relative_spread(group) for key, group in values.items()}


def _run_row(session: Session, result: dict[str, Any], result_path: str | None, source: str,
             where: str = "") -> Run:
    """The run row of one measurement; `where` is its key path in the file (measurements[i].)."""
    spec = result["spec"]
    sweep = result["sweep"]
    env = result["environment"]
    timings = result.get("timings") or {}
    images = result.get("images") or {}
    op_time_ms = timings.get("op_time_ms") or {}
    dataset = spec.get("dataset")
    params = spec.get("params") or {}
    grid = result.get("grid")
    stopping = result.get("stopping")
    samples = result.get("samples") or []
    spreads = _sample_spreads(samples)
    now = datetime.now(timezone.utc)

    sweep_id = _get_or_create(
        session, Sweep,
        {"experiment": sweep["experiment"], "config_hash": sweep["config_hash"]},
        {"config_path": sweep.get("config_path"), "created_at": now},
    )
    environment_id = _get_or_create(
        session, Environment,
        {"env_hash": canonical_hash(env)},
        {k: env.get(k) for k in ("hostname", "gpu", "gpu_uuid", "compute_capability", "driver", "cuda_driver",
                                 "nvrtc", "nsys", "python", "packages")},
    )
    git = result.get("git") or {"commit": env.get("git_commit"), "dirty": None}  # format 1 kept it there
    clocks = result.get("clocks") or {}
    clocks_after = result.get("clocks_after") or {}
    energy = result.get("energy") or {}
    throttle = result.get("throttle")
    throttled_repeats = set(throttle["repeats"]) if throttle else set()
    sources = result.get("sources") or None
    # A build keeps the compile_ms and cache_hit of the run that first stored it; each run's own
    # compile time is run.compile_ms.
    build_ids = {
        _get_or_create(
            session, Build,
            {"build_key": build_key(build)},
            {k: build.get(k) for k in ("variant", "params", "arch", "options_hash", "source_hash",
                                       "compile_ms", "cache_hit", "log", "kernels")},
        )
        for build in result.get("builds") or []
    }

    run = Run(
        measurement_id=measurement_id(result),
        run_key=result["run_key"],
        job_id=result["job_id"],
        job_key=grid["job_key"] if grid else None,
        grid=grid,
        sweep_id=sweep_id,
        environment_id=environment_id,
        experiment=spec["experiment"],
        network=spec["network"],
        dataset=dataset["name"] if isinstance(dataset, dict) else dataset,  # IDX files: their name
        variants=spec["variants"],
        params=spec.get("params"),
        variant=variant_label(spec["variants"]),
        batch=spec["batch"],
        streams=spec["streams"],
        host_memory=spec["host_memory"],
        chunk_images=spec.get("chunk_images"),
        cache=spec.get("cache", "warm"),
        # the timed passes taken: the stopping rule's count, else the fixed number asked for
        repeats=stopping["samples"] if stopping else (spec.get("repeats") if spec.get("repeats") != "auto" else None),
        stop_reason=stopping["reason"] if stopping else None,
        warmup=spec.get("warmup"),
        profiler_requested=spec.get("profiler"),
        profiler=result.get("profiler"),
        status=result["status"],
        error=result.get("error"),
        accuracy=result.get("accuracy"),
        prediction_agreement=result.get("prediction_agreement"),
        max_rel_err=result.get("max_rel_err"),
        tolerance=result.get("tolerance"),
        images_unique=images.get("unique"),
        cycled=images.get("cycled"),
        h2d_ms=timings.get("h2d_ms"),
        d2h_ms=timings.get("d2h_ms"),
        compute_ms=timings.get("compute_ms"),
        forward_ms=timings.get("forward_ms"),
        forward_spread=spreads.get(("forward_ms", None)),
        overlap=timings.get("overlap"),
        total_s=timings.get("total_s"),
        compile_ms=timings.get("compile_ms"),
        phases=result.get("phases_s"),
        floors=result.get("floors"),
        files=result.get("files"),
        started_at=utc_time(result.get("started_at"), source, f"{where}started_at"),
        ingested_at=now,
        result_path=result_path,
        source_hash=canonical_hash(sources) if sources else None,
        sources=sources,
        git_commit=git.get("commit"),
        git_dirty=git.get("dirty"),
        sm_clock_mhz=clocks.get("sm_mhz"),
        memory_clock_mhz=clocks.get("memory_mhz"),
        sm_clock_after_mhz=clocks_after.get("sm_mhz"),
        memory_clock_after_mhz=clocks_after.get("memory_mhz"),
        throttle_reasons=",".join(throttle["reasons"]) if throttle else None,
        throttled_passes=len(throttled_repeats) if throttle else None,
        note="; ".join(n for n in (result.get("note"), result.get("profiler_note")) if n) or None,
        energy_j=energy.get("joules"),
        energy_per_pass_j=energy.get("joules_per_pass"),
    )
    run.builds = [session.get(Build, build_id) for build_id in sorted(build_ids)]
    run.samples = [
        Sample(metric=s.get("metric"), layer=s.get("layer"), repeat=s.get("repeat"), value=s.get("value"),
               throttled=s.get("repeat") in throttled_repeats if throttle else None)
        for s in samples
    ]
    run.kernels = [
        KernelStat(**{k: kernel.get(k) for k in (
            "layer", "name", "launches", "total_ms", "median_ms", "grid", "block", "registers",
            "static_shared_bytes", "dynamic_shared_bytes", "local_bytes")})
        for kernel in result.get("kernels") or []
    ]
    run.memcpys = [
        Memcpy(kind=m.get("kind"), count=m.get("count"), bytes=m.get("bytes"), total_ms=m.get("total_ms"))
        for m in result.get("memcpys") or []
    ]
    floors = result.get("floors") or {}
    run.layer_times = [
        LayerTime(layer_index=index, layer=layer, variant=spec["variants"].get(layer), params=params.get(layer),
                  op_time_ms=op_time_ms.get(layer), op_time_spread=spreads.get(("op_time_ms", layer)),
                  flops=(floors.get(layer) or {}).get("flops"),
                  bytes=(floors.get(layer) or {}).get("bytes"))
        for index, layer in enumerate(conv_layers(spec["variants"], floors, op_time_ms))
    ]
    run.phase_times = [Phase(name=name, seconds=seconds) for name, seconds in (result.get("phases_s") or {}).items()]
    return run


def read_result(path: str | Path) -> Any:
    """One result file, parsed strictly (strict_json.read_json); a file that cannot be read, is not
    JSON, or holds a number no column can, raises StoreError naming the file and the key."""
    return read_json(path)


def ingest_files(engine: Engine, paths: Iterable[str | Path]) -> IngestReport:
    """Ingest result files one transaction each, counting measurements. A file that cannot be read
    or stored becomes one line of the report's errors and the others go on; only a database that
    cannot be used at all (StoreUnavailable) stops it. Many files show a progress bar (convsweep.progress)."""
    report = IngestReport()
    paths = list(paths)
    for path in progress(paths, desc="ingest", unit="file", enabled=len(paths) > 1):
        try:
            report.merge(ingest_result(engine, read_result(path), str(path)))
        except StoreUnavailable:
            raise
        except StoreError as exc:
            report.errors.append(str(exc))
        except Exception as exc:
            # Whatever one file runs into (a string no driver can encode, an int SQLite cannot bind, a
            # bug), the rest are stored; its session's `with` has already rolled its transaction back.
            detail = " ".join(str(exc).split())
            report.errors.append(f"{path}: cannot ingest: {type(exc).__name__}" + (f": {detail}" if detail else ""))
    return report
