"""`convsweep confirm-job`: a cell's fastest settings timed again, interleaved, and each conv layer's winner named
(a sweep runs one per cell)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from convsweep.measure.confirm import ConfirmSpec, run_confirm_job, summary_lines, write_skipped
from convsweep.base.errors import ConvsweepError
from .common import add_worker, worker_command


def add_parser(sub) -> None:
    p = sub.add_parser("confirm-job", help="time a cell's fastest settings again, interleaved, and name each conv "
                                           "layer's winner (a sweep runs one per cell)")
    p.add_argument("--spec-file", required=True, help="the confirm spec (a sweep writes one per cell in "
                                                      "<results>/<experiment>/specs/)")
    p.add_argument("--out", required=True, help="the confirm JSON to write")
    add_worker(p)
    p.set_defaults(func=run)


def run(args) -> None:
    try:
        data = json.loads(Path(args.spec_file).read_text())
    except (OSError, ValueError) as e:
        raise ConvsweepError(f"--spec-file {args.spec_file}: cannot read a confirm spec ({e})") from None
    if not isinstance(data, dict):
        raise ConvsweepError(f"--spec-file {args.spec_file}: expected a JSON object")
    spec = ConfirmSpec.from_dict(data)
    if args.worker:
        written = run_confirm_job(spec, Path(args.out))
    else:  # watched as a job is: a pass that never ends costs the cell's deadline (convsweep.measure.deadline)
        from convsweep.measure.deadline import watch
        from convsweep.measure.record import utc_now
        from convsweep.sweep.config import JobSpec

        started, started_at = time.perf_counter(), utc_now()
        deadline_s = float(JobSpec.from_dict(spec.job).deadline_s)
        status, hung = watch(worker_command(args, "confirm-job", "--spec-file", args.spec_file, "--out", args.out),
                             deadline_s)
        if hung is None:
            if status:
                raise SystemExit(status)
            return
        written = write_skipped(spec, Path(args.out), hung.message(deadline_s), started,
                                started_at)
    for line in summary_lines(written):
        print(line)
