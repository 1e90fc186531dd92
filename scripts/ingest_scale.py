"""Ingest N synthetic result files into a database and print the time and rows/s: the numbers
behind docs/scaling.md (what storing a 10,000-job sweep costs, and whether to ingest per job or
per experiment).

The files have the shape of tests/store_fixtures.py's `make_job_file` (format 3: one job, one
measurement per tunable setting, with nsys-style kernel and copy rows), so the test extra is
needed (`pip install -e '.[test]'`). Use an empty database: the rows it adds are counted.

    python scripts/ingest_scale.py --db postgresql+psycopg://postgres@127.0.0.1:5432/scale -n 10000
    python scripts/ingest_scale.py --db sqlite:////tmp/scale.sqlite -n 10000 --per-job 20
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from sqlalchemy import func, select, text  # noqa: E402

from convsweep.store import Base, ingest_files, open_store  # noqa: E402
from convsweep.store.engine import sqlite_path  # noqa: E402
from store_fixtures import every_layer, make_job_file, make_result  # noqa: E402

BLOCKS = [64, 128, 256, 512, 1024]  # naive's tunable values: a job's settings differ in BLOCK


def write_files(directory: Path, count: int, settings: int, first_batch: int = 1) -> list[Path]:
    """`count` result files of distinct jobs (batch first_batch, first_batch + 1, ...), each with
    `settings` measurements."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for batch in range(first_batch, first_batch + count):
        measurements = [make_result("naive", batch, experiment="scale", params=every_layer(BLOCK=block))
                        for block in BLOCKS[:settings]]
        job = make_job_file(measurements)
        path = directory / f"{job['job_id']}.json"
        path.write_text(json.dumps(job), encoding="utf-8")
        paths.append(path)
    return paths


def _ingest_chunk(url: str, paths: list[Path]) -> tuple[int, int]:
    """One writer process: its own engine, one transaction per file (as `convsweep ingest` does)."""
    engine = open_store(url)
    try:
        report = ingest_files(engine, paths)
        return report.added, len(report.errors)
    finally:
        engine.dispose()


def row_counts(engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {table.name: connection.scalar(select(func.count()).select_from(table))
                for table in Base.metadata.sorted_tables}


def database_bytes(engine) -> int:
    """The database's size on disk; an SQLite file's WAL is folded in first, so pages rewritten
    many times count once."""
    path = sqlite_path(engine.url)
    if path is not None:
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    with engine.connect() as connection:
        return connection.scalar(text("SELECT pg_database_size(current_database())"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="database URL (an empty database)")
    parser.add_argument("-n", "--files", type=int, default=10_000, help="result files, one job each")
    parser.add_argument("--settings", type=int, default=1, choices=range(1, len(BLOCKS) + 1),
                        help="measurements (run rows) per file")
    parser.add_argument("--writers", type=int, default=1, help="processes ingesting at once, each its share")
    parser.add_argument("--per-job", type=int, default=0, metavar="K",
                        help="also time K more files each by its own `convsweep ingest` process")
    parser.add_argument("--dir", type=Path, help="where to write the files (default: a temporary folder)")
    args = parser.parse_args()

    directory = args.dir or Path(tempfile.mkdtemp(prefix="convsweep-scale-"))
    t = time.perf_counter()
    paths = write_files(directory, args.files, args.settings)
    made = time.perf_counter() - t
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} files, {args.settings} setting(s) each, in {directory}: {size / 1e6:.1f} MB "
          f"({size / len(paths) / 1e3:.1f} kB per file), written in {made:.1f} s")

    t = time.perf_counter()
    engine = open_store(args.db)
    before = row_counts(engine)
    bytes_before = database_bytes(engine)
    print(f"open and migrate: {time.perf_counter() - t:.2f} s")

    t = time.perf_counter()
    chunks = [paths[i::args.writers] for i in range(args.writers)]
    if args.writers == 1:
        results = [_ingest_chunk(args.db, paths)]
    else:
        with ProcessPoolExecutor(args.writers) as pool:
            results = list(pool.map(_ingest_chunk, [args.db] * args.writers, chunks))
    seconds = time.perf_counter() - t
    added, failed = sum(r[0] for r in results), sum(r[1] for r in results)

    after = row_counts(engine)
    rows = sum(after.values()) - sum(before.values())
    grown = database_bytes(engine) - bytes_before
    print(f"ingest with {args.writers} writer(s): {seconds:.1f} s for {len(paths)} files, {added} runs added, "
          f"{failed} failed")
    print(f"  {len(paths) / seconds:.0f} files/s, {added / seconds:.0f} runs/s, {rows / seconds:.0f} rows/s "
          f"({rows} rows in all tables: " + ", ".join(f"{name} {after[name] - before[name]}"
                                                     for name in after if after[name] != before[name]) + ")")
    print(f"  database grew {grown / 1e6:.1f} MB: {grown / max(added, 1) / 1e3:.1f} kB per run")

    if args.per_job:
        extra = write_files(directory / "per-job", args.per_job, args.settings, first_batch=args.files + 1)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        t = time.perf_counter()
        for path in extra:
            subprocess.run([sys.executable, "-m", "convsweep", "ingest", "--db", args.db, str(path)],
                           check=True, env=env, stdout=subprocess.DEVNULL)
        each = (time.perf_counter() - t) / len(extra)
        print(f"per job: {len(extra)} files, each by its own `convsweep ingest` process: {each:.2f} s per file")
    engine.dispose()


if __name__ == "__main__":
    main()
