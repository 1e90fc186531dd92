"""Store test helpers: a database URL per backend (a SQLite file, or a fresh PostgreSQL database
on the server in $CONVSWEEP_TEST_PG_URL) and factories for result files in the contract's shape:
one measurement (format 2, `make_result`) or a job measuring several settings (format 3,
`make_job_file`)."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError

from convsweep.store import Base

PG_ENV = "CONVSWEEP_TEST_PG_URL"
NO_PG_REASON = "no PostgreSQL server: set CONVSWEEP_TEST_PG_URL (.ci/run starts one)"
BACKENDS = ["sqlite", "postgresql"]
TABLES = ["sweep", "environment", "build", "run", "run_build", "sample", "kernel", "memcpy", "layer_time"]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path):
    """A URL of an empty database on each backend; PostgreSQL gets a database of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db' / 'results.sqlite'}"
    else:
        yield from _fresh_pg_database()


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """db_url's database made once for a module, for the fixture of a module whose tests only read it."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'results.sqlite'}"
    else:
        yield from _fresh_pg_database()


@pytest.fixture
def empty_pg_url():
    """A URL of an empty PostgreSQL database of its own (skipped without a server)."""
    yield from _fresh_pg_database()


def _fresh_pg_database():
    server = os.environ.get(PG_ENV)
    if not server:
        pytest.skip(NO_PG_REASON)
    name = f"convsweep_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(server).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def row_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {t: connection.scalar(select(func.count()).select_from(Base.metadata.tables[t])) for t in TABLES}


def make_result(variant: str | dict[str, str] = "naive", batch: int = 100, streams: int = 1,
                status: str = "ok", op_time_ms: tuple[float, ...] = (0.74, 1.76),
                experiment: str = "lenet86-baseline", host_memory: str = "pageable",
                params: dict[str, dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
    """One job's result JSON (docs/result-format.md), format 2; ok, suspect (right outputs, a time below its
    floor), incorrect or failed. `params`: conv layer -> its tunables (default: none)."""
    variants = variant if isinstance(variant, dict) else {"conv1": variant, "conv2": variant}
    params = {layer: dict((params or {}).get(layer, {})) for layer in variants}
    spec = {
        "experiment": experiment, "network": "networks/lenet86.yaml", "dataset": "mnist5k",
        "variants": variants, "params": params,
        "batch": batch, "streams": streams, "host_memory": host_memory,
        "repeats": 3, "warmup": 1, "profiler": "nsys",
    }
    run_key = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    failed = status == "failed"
    right = status in ("ok", "suspect")  # its outputs passed the check
    timed = not failed
    layers = list(variants)
    result: dict[str, Any] = {
        "format": 2,
        "measurement_id": uuid.uuid4().hex,
        "job_id": f"{'-'.join(sorted(set(variants.values())))}-b{batch}-s{streams}-{run_key[:8]}",
        "run_key": run_key,
        "spec": spec,
        "sweep": {"experiment": experiment, "config_hash": "c" * 64, "config_path": "experiments.yaml"},
        "git": {"commit": "abc123" + "0" * 34, "dirty": False},
        "sources": {f"kernels/{name}.cu": hashlib.sha256(name.encode()).hexdigest()
                    for name in sorted(set(variants.values()))},
        "clocks": {"sm_mhz": 1980, "memory_mhz": 2619} if not failed else {"sm_mhz": None, "memory_mhz": None},
        "environment": {
            "hostname": "node1", "gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-5e1c2d6a-0000-4000-8000-000000000001",
            "compute_capability": "9.0", "driver": "580.95.05", "cuda_driver": "13.0", "nvrtc": "13.0",
            "nsys": "2025.3.1", "python": "3.11.7", "packages": {"numpy": "2.1.0", "cuda-core": "0.4.0"},
        },
        "status": status,
        "error": {"ok": None,
                  "suspect": "conv1 took 0.001 ms, below the physical floor of 0.01 ms at this GPU's peak rates",
                  "incorrect": "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)",
                  "failed": "compile failed: tiled.cu(12): error: identifier TILE undefined"}[status],
        "profiler": "nsys" if timed else None,
        "started_at": "2026-11-22T18:40:00+00:00",
        "accuracy": (0.982 if right else 0.1) if timed else None,
        "prediction_agreement": (0.9996 if right else 0.12) if timed else None,
        "max_rel_err": (3.1e-7 if right else 0.5) if timed else None,
        "tolerance": 1e-5,
        "images": {"batch": batch, "unique": min(batch, 5000), "cycled": batch > 5000},
        "timings": {
            "op_time_ms": dict(zip(layers, op_time_ms)) if timed else None,
            "h2d_ms": 3.9 if timed else None, "d2h_ms": 0.01 if timed else None,
            "compute_ms": sum(op_time_ms) + 0.1 if timed else None,
            "forward_ms": sum(op_time_ms) + 4.0 if timed else None,
            "overlap": 0.0 if timed else None, "total_s": 6.2 if timed else None,
            "compile_ms": 1.2 if timed else None,
        },
        "phases_s": {"load": 0.3, "compile": 0.01, "timed": 0.5},
        "floors": {layer: layer_floors(index, batch) for index, layer in enumerate(layers)},
        "samples": [
            {"metric": "op_time_ms", "layer": layer, "repeat": r, "value": t + 0.001 * r}
            for layer, t in zip(layers, op_time_ms) for r in range(3)
        ] + [{"metric": "forward_ms", "layer": None, "repeat": r, "value": 42.1 + r} for r in range(3)]
        if timed else [],
        "builds": [
            {"variant": name, "params": next(params[layer] for layer in layers if variants[layer] == name),
             "arch": "sm_90", "options_hash": "o" * 64,
             "source_hash": hashlib.sha256(name.encode()).hexdigest(), "compile_ms": 35.2,
             "cache_hit": False, "log": "ptxas info : Used 40 registers",
             "kernels": [{"name": f"{name}_forward", "registers": 40, "shared_bytes": 0,
                          "local_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0}]}
            for name in sorted(set(variants.values()))
        ] if timed else [],
        "kernels": [
            {"layer": layer, "name": f"{variants[layer]}_forward", "launches": 3, "total_ms": 3 * t,
             "median_ms": t, "grid": [80, 4, batch], "block": [16, 16, 1], "registers": 40,
             "static_shared_bytes": 1024, "dynamic_shared_bytes": 0, "local_bytes": 0}
            for layer, t in zip(layers, op_time_ms)
        ] if timed else [],
        "memcpys": [
            {"kind": "H2D", "count": 3, "bytes": 14792000 * batch // 500, "total_ms": 6.1},
            {"kind": "D2H", "count": 3, "bytes": 40 * batch, "total_ms": 0.03},
        ] if timed else [],
        "files": {"nsys_report": f"results/{experiment}/runs/x.nsys-rep"},
    }
    for key, value in overrides.items():
        result[key] = value
    return copy.deepcopy(result)


def as_format_1(result: dict[str, Any]) -> dict[str, Any]:
    """The same result as a format-1 file held it: no measurement id or provenance keys, the
    commit in the environment."""
    old = copy.deepcopy(result)
    git = old.pop("git")
    for key in ("measurement_id", "sources", "clocks"):
        old.pop(key)
    old["format"] = 1
    old["environment"] = {k: v for k, v in old["environment"].items() if k not in ("gpu_uuid", "cuda_driver")}
    old["environment"]["git_commit"] = git["commit"]
    return old


def layer_floors(index: int, batch: int) -> dict[str, int]:
    """The fake floors of a run's index-th conv layer; conv2's flops pass 2**31 (BIGINT) from batch 537."""
    return {"bytes": (index + 1) * 40_000 * batch + 1_000, "flops": (index + 1) * 2_000_000 * batch}


def standard_results() -> list[dict[str, Any]]:
    """Two variants at two batch sizes, plus an incorrect run (fastest of all) and a failed one."""
    return [
        make_result("naive", 100, op_time_ms=(0.082, 0.191)),
        make_result("naive", 1000, op_time_ms=(0.740, 1.76)),
        make_result("tiled", 100, op_time_ms=(0.060, 0.150)),
        make_result("tiled", 1000, op_time_ms=(0.500, 1.20)),
        make_result("fp16", 1000, status="incorrect", op_time_ms=(0.010, 0.020)),
        make_result("broken", 100, status="failed"),
    ]


INTEGRITY_FIXTURES = Path(__file__).parent / "fixtures" / "integrity-results"


def integrity_results() -> list[dict[str, Any]]:
    """tests/fixtures/integrity-results: experiment lenet86-integrity at batch 10000, a naive job whose
    BLOCK=64 setting is ok and whose BLOCK=128 one is suspect (the fastest of all, with its reasons), and a
    tiled job measured with fast checks (ok, the fastest ok run)."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(INTEGRITY_FIXTURES.glob("*.json"))]


def every_layer(**tunables: Any) -> dict[str, dict[str, Any]]:
    """The same tunables for LeNet's two conv layers: make_result's `params`."""
    return {"conv1": dict(tunables), "conv2": dict(tunables)}


def tuning_results(batch: int = 100, **overrides: Any) -> list[dict[str, Any]]:
    """Three settings of one naive cell: BLOCK 64 ok, 128 incorrect (the fastest) and 256 failed."""
    return [
        make_result("naive", batch, params=every_layer(BLOCK=64), op_time_ms=(0.50, 0.90), **overrides),
        make_result("naive", batch, params=every_layer(BLOCK=128), status="incorrect", op_time_ms=(0.10, 0.20),
                    **overrides),
        make_result("naive", batch, params=every_layer(BLOCK=256), status="failed", **overrides),
    ]


def make_job_file(measurements: list[dict[str, Any]] | None = None, search: dict[str, Any] | None = None,
                  valid: int | None = None, **overrides: Any) -> dict[str, Any]:
    """A format 3 result file (docs/result-format.md): one cell of the matrix and one measurement per
    setting. `measurements` are make_result dicts of that cell, one per setting (default:
    tuning_results()); their grid is the tunable values they use, their search `search` (default:
    all of the grid), out of `valid` settings (default: as many as measured)."""
    measurements = copy.deepcopy(tuning_results() if measurements is None else measurements)
    first = measurements[0]["spec"]
    search = search or {"strategy": "grid"}
    valid = len(measurements) if valid is None else valid
    grid: dict[str, dict[str, list[Any]]] = {}
    for measurement in measurements:
        spec = measurement["spec"]
        for layer, tunables in spec["params"].items():
            values = grid.setdefault(spec["variants"][layer], {})
            for name, value in tunables.items():
                if value not in values.setdefault(name, []):
                    values[name].append(value)
    job = {**{k: v for k, v in first.items() if k != "params"}, "grid": grid, "search": search}
    job_key = hashlib.sha256(json.dumps(job, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    job_id = (f"{'-'.join(sorted(set(first['variants'].values())))}-b{first['batch']}-s{first['streams']}"
              f"-{first['host_memory']}-{job_key[:10]}")
    for index, measurement in enumerate(measurements):
        del measurement["format"]
        measurement["job_id"] = job_id
        measurement["grid"] = {"job_key": job_key, "index": index, "settings": len(measurements), "valid": valid,
                               "search": search}
    job_file: dict[str, Any] = {
        "format": 3,
        "job_id": job_id,
        "job_key": job_key,
        "job": job,
        "sweep": measurements[0]["sweep"],
        "settings": {"valid": valid, "measured": len(measurements), "resumed": 0},
        "started_at": measurements[0]["started_at"],
        "total_s": 4.0 + 0.5 * len(measurements),
        "phases_s": {"process_start": 0.8, "load": 0.3, "compile": 0.4, "reference": 0.2, "profile": 1.1},
        "files": {},
        "measurements": measurements,
    }
    job_file.update(overrides)
    return job_file


def write_results(directory: Path, results: list[dict[str, Any]]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for result in results:
        path = directory / f"{result['job_id']}.json"
        path.write_text(json.dumps(result), encoding="utf-8")
        paths.append(path)
    return paths


READER = "convsweep_test_reader"


def as_reader(url: str) -> str:
    """The URL of the same PostgreSQL database for a plain role that may read every table, which convsweep query
    wants (it refuses a superuser); a SQLite URL as it is. The role is made on first use."""
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "postgresql":
        return url
    _make_reader(url)
    return sa_url.set(username=READER, password=READER).render_as_string(hide_password=False)


@functools.cache
def _make_reader(admin_url: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        if connection.exec_driver_sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{READER}'").first() is None:
            try:
                connection.exec_driver_sql(f"CREATE ROLE {READER} LOGIN PASSWORD '{READER}'")
            except DBAPIError:  # made meanwhile by another test process
                pass
        try:
            connection.exec_driver_sql(f"GRANT pg_read_all_data TO {READER}")
        except DBAPIError:  # granted at the same moment by another test process (pytest-xdist's workers)
            if not connection.exec_driver_sql(f"SELECT pg_has_role('{READER}', 'pg_read_all_data', 'MEMBER')").scalar():
                raise
    admin.dispose()


def with_one_result(url: str) -> str:
    """`url` after storing one measurement in it (the database is made where it is missing)."""
    from convsweep.store import ingest_result, open_store

    engine = open_store(url)
    ingest_result(engine, make_result(), None)
    engine.dispose()
    return url


def make_confirmation(job_file: dict[str, Any], layer: str = "conv1", ms: tuple[float, ...] | None = None,
                      standings: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A confirm file (workflow/schemas/confirm.schema.yaml) of `layer` over the ok measurements of a job file, in
    their order: the first ranking theirs, `ms` each one's confirmed median (default: theirs) and `standings`
    their verdicts (default: the first winner, the rest slower)."""
    ok = [m for m in job_file["measurements"] if m["status"] == "ok"]
    ms = ms or tuple(m["timings"]["op_time_ms"][layer] for m in ok)
    standings = standings or ("winner",) + ("slower",) * (len(ok) - 1)
    order = sorted(range(len(ok)), key=lambda i: ms[i])
    entries = [{"measurement_id": ok[i]["measurement_id"], "first_place": i + 1,
                "first_ms": ok[i]["timings"]["op_time_ms"][layer], "place": place, "standing": standings[i],
                "median_ms": ms[i], "spread": 0.01, "difference_ms": ms[i] - ms[order[0]],
                "p_value": None if place == 1 else 0.01, "detectable_ms": 0.002, "samples_ms": [ms[i]] * 10,
                "error": None} for place, i in enumerate(order, start=1)]
    first = ok[0]["spec"]
    return {"format": "confirm-1", "confirmation_id": uuid.uuid4().hex, "experiment": first["experiment"],
            "group_id": f"winners-b{first['batch']}-s1-0123456789", "batch": first["batch"], "top": len(ok),
            "rounds": 10, "status": "ok", "reason": None, "started_at": "2026-11-26T12:00:00.000+00:00",
            "total_s": 1.0, "environment": {"gpu": "NVIDIA H100 80GB HBM3"},
            "clocks": {"sm_mhz": 1980, "memory_mhz": 2619}, "clocks_after": {"sm_mhz": 1980, "memory_mhz": 2619},
            "candidates": [{"measurement_id": m["measurement_id"], "job_id": m["job_id"], "run_key": m["run_key"],
                            "variant": m["spec"]["variants"][layer], "variants": m["spec"]["variants"],
                            "params": m["spec"]["params"], "status": "ok",
                            "error": None} for m in ok],
            "layers": [{"layer": layer, "layer_index": list(first["variants"]).index(layer),
                        "overturned": standings[0] not in ("winner", "tied"), "entries": entries}]}
