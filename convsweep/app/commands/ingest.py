"""`convsweep ingest`: store result files in the database, each once."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .common import add_db


def add_parser(sub) -> None:
    p = sub.add_parser("ingest", help="store result JSONs in the database (idempotent)")
    p.add_argument("results", nargs="*", help="result JSON files written by run-job or profile-job, or folders of "
                                              "them (each *.json file directly in it)")
    add_db(p)
    p.add_argument("--report", metavar="FILE", help="write the counts (added, already stored, failed) as JSON")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.base.fileio import write_json_atomic
    from convsweep.store import ingest_files, open_store

    files = _result_files(args.results)
    engine = open_store(args.db)
    t = time.perf_counter()
    report = ingest_files(engine, files)
    summary = {"added": report.added, "unchanged": report.unchanged, "failed": len(report.errors),
               "files": len(files), "seconds": round(time.perf_counter() - t, 3)}
    for error in report.errors:
        print(f"convsweep: {error}", file=sys.stderr)
    for skipped in report.skipped:
        print(f"skipped {skipped}")
    print(f"ingested {summary['files']} results: {report.added} added, {report.unchanged} already stored"
          + (f", {len(report.errors)} could not be stored" if report.errors else ""))
    if report.errors:
        raise SystemExit(1)
    if args.report:
        write_json_atomic(Path(args.report), summary)


def _result_files(paths: list[str]) -> list[Path]:
    """The files named, and in each folder named the *.json files directly in it, by name."""
    files = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return files
