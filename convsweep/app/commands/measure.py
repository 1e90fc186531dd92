"""`convsweep measure`: run-job's inner half under nsys, a command for convsweep itself (so it has no help line)."""
from __future__ import annotations

from pathlib import Path

from .common import add_spec_source, job_spec, read_spec


def add_parser(sub) -> None:
    p = sub.add_parser("measure")
    add_spec_source(p)
    p.add_argument("--out", required=True, help="the result JSON to write")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.measure.job import measure_to_file

    data = read_spec(args)
    settings = data.get("settings")  # None: every setting of the job
    measure_to_file(job_spec(data.get("job", {})), None if settings is None else list(settings), Path(args.out),
                    [tuple(pair) for pair in data.get("told") or []])
