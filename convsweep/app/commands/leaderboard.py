"""`convsweep leaderboard`: a course's submissions ranked per GPU model and batch, in statistical tiers, with points."""
from __future__ import annotations

import sys

from .common import add_db, add_experiment, add_format


def add_parser(sub) -> None:
    p = sub.add_parser("leaderboard", help="rank a course's submissions per GPU and batch, in tiers the samples can "
                                           "tell apart, with points",
                       description="A submission is a student's variants, named SUBMISSION__VARIANT (a name without "
                                   "__ is its own submission). Per experiment, GPU model and cell (the batch and the "
                                   "other axes) each submission stands by its best trusted run (ok, every check "
                                   "passed, checks: full), ranked by its median op-time sum; those the stored samples "
                                   "cannot tell apart share a tier and a rank (docs/leaderboard.md). Every run not "
                                   "ranked (failed, incorrect, suspect, timed out, not fresh, fast-checked) is listed "
                                   "below with its reason and its builds' findings.")
    add_db(p)
    add_experiment(p, "the experiment to rank (default: every experiment, each on boards of its own)")
    add_format(p)
    p.add_argument("--points", metavar="FILE",
                   help="a thresholds file (workflow/schemas/leaderboard.schema.yaml), e.g. `points: "
                        "[{op_time_sum_ms_at_most: 80, batch: 10000, points: 100}]`: each submission's points")
    # convsweep.analysis.leaderboard.DEFAULT_THRESHOLD (a test ties them), written out so that building the parser
    # does not import the database layer for every command.
    p.add_argument("--threshold", type=float, default=0.05,
                   help="a new tier starts where the 95%% interval of a median over its tier leader's lies wholly "
                        "above 1 + this (default: %(default)s)")
    p.add_argument("--fast-checks", action="store_true",
                   help="rank runs measured with `checks: fast` too (no caching test vouches for them; marked); "
                        "by default they are listed as not ranked")
    p.add_argument("--html", metavar="FILE", help="also write the leaderboard as one standalone HTML page")
    p.add_argument("--reports", metavar="DIR",
                   help="also write each submission's milestone report into DIR, one standalone page each "
                        "(<submission>.html): its results per GPU and batch, speedup, Nsight Compute, nsys, history")
    p.add_argument("--baseline", default="naive", metavar="NAME",
                   help="the submission the reports' speedups are over, where it ranked beside them (default: "
                        "%(default)s, the shipped baseline run in the class's sweep)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.analysis.leaderboard import leaderboard, load_points, render, write_html

    points = load_points(args.points) if args.points else None
    boards = leaderboard(args.db, args.experiment, threshold=args.threshold, fast_checks=args.fast_checks,
                         points=points)
    print(render(boards, args.format, args.threshold), end="" if args.format == "csv" else "\n")
    if args.html:
        write_html(args.html, boards, args.threshold, args.experiment)
        print(f"leaderboard: wrote {args.html}", file=sys.stderr)
    if args.reports:
        from convsweep.analysis.milestone import write_reports

        written = write_reports(args.db, boards, args.reports, args.baseline)
        print(f"leaderboard: wrote {len(written)} milestone reports into {args.reports}", file=sys.stderr)
