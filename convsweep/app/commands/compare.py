"""`convsweep compare`: B against A, job by job, with a verdict and a gate."""
from __future__ import annotations

import sys

from .common import add_db, add_format


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="B against A, job by job: ratio of medians, its interval, SAME/FASTER/SLOWER/UNSURE, or SUSPECT",
                       description="A and B select stored runs: latest and previous (each job's newest measurement, "
                                   "and the one before it), sweep:N, commit:SHA, a git revision (HEAD~1, HEAD, or "
                                   "rev:NAME), experiment:NAME, results:DIR (a sweep's results directory), runs:LO-HI, "
                                   "or the bare value; with none, previous and latest. Each matched job gets the ratio "
                                   "of B's median to A's over the stored samples, a 95% bootstrap interval and a "
                                   "verdict. Exit status 1 when a verdict fails --fail-on (SUSPECT never does).")
    p.add_argument("a", nargs="?", help="the baseline selection (default: previous)")
    p.add_argument("b", nargs="?", help="the selection compared with it (default: latest)")
    add_db(p)
    p.add_argument("--db-b", metavar="URL",
                   help="SQLAlchemy URL of the result store B is read from, when not --db's "
                        "(say, another machine's or session's SQLite file; default: --db)")
    p.add_argument("--metric", default="op_time",
                   help="op_time (the conv layers' op times added up, per pass), forward_ms (the whole pass), or "
                        "a conv layer's name for its op time alone (default: %(default)s)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="the change that counts: SLOWER/FASTER beyond it, SAME within it (default: %(default)s)")
    p.add_argument("--cpu", action="store_true",
                   help="also compare the jobs timed on the CPU (the `reference` variant, numpy float32): left out "
                        "by default, since a shared host moves their times by tens of percent between runs")
    add_format(p, ("table", "json"))
    p.add_argument("--fail-on", choices=("slower", "unsure", "never"), default="slower",
                   help="the gate: exit 1 on SLOWER, on SLOWER or UNSURE, or never (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.analysis.compare import DEFAULT, compare, gate, render

    a, b = args.a or DEFAULT[0], args.b or DEFAULT[1]
    if not (args.a and args.b):
        print(f"compare: {a} -> {b}" + (": each job's newest measurement against the one before it"
                                         if (a, b) == DEFAULT else ""), file=sys.stderr)
    result = compare(args.db, a, b, metric=args.metric, threshold=args.threshold, db_b=args.db_b, cpu=args.cpu)
    print(render(result, args.format))
    failed, said = gate(result, args.fail_on)
    if args.fail_on != "never":
        print(f"compare: {said}", file=sys.stderr)
    if failed:
        raise SystemExit(1)
