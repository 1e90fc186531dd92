"""`convsweep run-job`: one job (every tunable setting of one cell of the sweep), its result file and its last line.
The job runs in a worker process this one watches: a pass past the spec's deadline costs that setting, not the
sweep (convsweep.measure.deadline)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import cast

from convsweep.app.cliargs import process_age
from .common import add_spec_source, add_worker, job_spec, read_spec, worker_command


def add_parser(sub) -> None:
    p = sub.add_parser("run-job", help="run one job (every tunable setting of one cell of the sweep) and write its "
                                       "result JSON")
    add_spec_source(p)
    p.add_argument("--out", required=True, help="the result JSON to write")
    add_worker(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.sweep.config import tunables_text
    from convsweep.measure.job import run_job
    from convsweep.analysis.outcome import settings_not_ok
    from convsweep.measure.record import Measurement

    def op_times(m: Measurement) -> dict[str, float | None]:
        assert m.timings is not None and m.timings.op_time_ms is not None  # an ok measurement's
        return m.timings.op_time_ms

    spec = job_spec(read_spec(args))
    if not args.worker:
        from convsweep.measure.deadline import supervise

        own = ["--spec-file", args.spec_file] if args.spec_file else ["--spec", args.spec]
        if status := supervise(spec, Path(args.out), worker_command(args, "run-job", *own, "--out", args.out)):
            raise SystemExit(status)
        return
    # A fresh process: the job takes its GPU's lock (a free one among several) before CUDA starts.
    result = run_job(spec, Path(args.out), process_age=process_age())
    measurements = result.measurements
    statuses = Counter(m.status for m in measurements)
    fastest = min((m for m in measurements if m.status == "ok"),
                  key=lambda m: sum(v or 0 for v in op_times(m).values()), default=None)
    best = ""
    if fastest is not None:
        ops = ", ".join(f"{k} {v:.3f} ms" for k, v in op_times(fastest).items() if v is not None)
        params = cast(dict, fastest.params)  # a job's setting has its tunables
        best = f"; fastest: {ops}" + (f" ({tunables_text(params)})" if len(measurements) > 1 else "")
    if said := settings_not_ok(measurements):  # whole: the table at the end of the sweep points at this log
        print("\n".join(said))
    # The job's last line: `convsweep watch` shows it for a job that finished.
    print(f"{result.job_id}: {len(measurements)} settings in {result.total_s:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())) + best)
