"""`convsweep profile-job`: each conv kernel of a job's settings once under Nsight Compute (never a timed job)."""
from __future__ import annotations

from pathlib import Path

from .common import add_spec_source, job_spec, read_spec


def add_parser(sub) -> None:
    p = sub.add_parser("profile-job", help="profile each conv kernel of a job's settings once with Nsight Compute "
                                           "(never a timed job)")
    add_spec_source(p)
    p.add_argument("--out", required=True, help="the result JSON to write")
    p.add_argument("--ncu", choices=("true", "auto"), default="true",
                   help="the experiment's ncu: true fails the job without ncu, auto writes a skipped profile "
                        "saying so (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.measure.ncu import run_profile_job

    result = run_profile_job(job_spec(read_spec(args)), Path(args.out), required=args.ncu == "true")
    if result["status"] == "ok":
        print(f"{result['job_id']}: {len(result['profiles'])} conv kernel launches profiled in {result['seconds']:.1f} s")
    else:  # never a failure of the sweep: the file says why, and ingest passes it on
        print(f"{result['job_id']}: not profiled: {result['reason']}")
