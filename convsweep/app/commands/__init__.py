"""The commands of `convsweep`, one module each (the command's name, `-` as `_`; `import_` for `import`): its
parser in `add_parser(sub)` and what it does in `run(args)`. What several share (--db, --experiment, --format,
a job spec) is declared once in common. The order here is the order of `convsweep --help`."""
from __future__ import annotations

from . import (bench, browse, compare, compile, confirm_job, export, import_, ingest, jobs, leaderboard, measure,
               plot, profile_job, query, replay, report, run_job, submissions, watch)

COMMANDS = (jobs, run_job, profile_job, measure, compile, ingest, query, bench, compare, watch, report, browse, plot,
            replay, export, import_, confirm_job, submissions, leaderboard)


def add_parsers(sub) -> None:
    """Every command's parser, on the command line's subparsers."""
    for command in COMMANDS:
        command.add_parser(sub)
