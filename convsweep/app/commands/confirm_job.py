"""`convsweep confirm-job`: a cell's fastest settings timed again, interleaved, and each conv layer's winner named
(a sweep runs one per cell)."""
from __future__ import annotations

import json
from pathlib import Path

from convsweep.measure.confirm import ConfirmSpec, run_confirm_job, summary_lines
from convsweep.base.errors import ConvsweepError


def add_parser(sub) -> None:
    p = sub.add_parser("confirm-job", help="time a cell's fastest settings again, interleaved, and name each conv "
                                           "layer's winner (a sweep runs one per cell)")
    p.add_argument("--spec-file", required=True, help="the confirm spec (a sweep writes one per cell in "
                                                      "<results>/<experiment>/specs/)")
    p.add_argument("--out", required=True, help="the confirm JSON to write")
    p.set_defaults(func=run)


def run(args) -> None:
    try:
        data = json.loads(Path(args.spec_file).read_text())
    except (OSError, ValueError) as e:
        raise ConvsweepError(f"--spec-file {args.spec_file}: cannot read a confirm spec ({e})") from None
    if not isinstance(data, dict):
        raise ConvsweepError(f"--spec-file {args.spec_file}: expected a JSON object")
    for line in summary_lines(run_confirm_job(ConfirmSpec.from_dict(data), Path(args.out))):
        print(line)
