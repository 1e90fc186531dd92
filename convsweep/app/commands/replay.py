"""`convsweep replay`: search strategies judged offline against stored whole grids (no GPU)."""
from __future__ import annotations

from convsweep.base.errors import ConvsweepError
from convsweep.analysis.replay import (DEFAULT_BUDGET, DEFAULT_SEEDS, JUDGED_COLUMNS, TOLERANCE, budget_for, judge, judged_row,
                      load_grids, save_grids, stored_grids)
from .common import add_db, add_experiment, add_format


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="judge search strategies offline against stored whole grids (no GPU)",
                       description="Replays each strategy against every job of EXPERIMENT whose whole grid is "
                                   "stored, once per seed, answering each setting it asks for from the stored "
                                   "medians, and prints how often it came within 2% of the grid's best and after "
                                   "how many settings.")
    add_experiment(p, "the experiment whose grids to replay (default: the grids file's)")
    p.add_argument("--strategy", default="grid,random,tpe,genetic",
                   help="strategies to judge, comma-separated (default: %(default)s)")
    p.add_argument("--budget", default=DEFAULT_BUDGET,
                   help="settings each search may measure: N, or P%% of its grid (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="searches per grid (default: %(default)s)")
    add_db(p)
    p.add_argument("--grids", metavar="FILE", help="replay the grids of this file instead of the database's")
    p.add_argument("--save", metavar="FILE", help="write the database's grids of EXPERIMENT to FILE (to commit)")
    add_format(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.analysis.query import render
    from convsweep.sweep.search import STRATEGIES

    if args.grids:
        experiment, grids = load_grids(args.grids)
        if args.experiment and args.experiment != experiment:
            raise ConvsweepError(f"{args.grids}: holds experiment {experiment!r}, not {args.experiment!r}")
    elif args.experiment:
        experiment, grids = args.experiment, stored_grids(args.db, args.experiment)
    else:
        raise ConvsweepError("replay: give --experiment (the database's grids) or --grids FILE")
    strategies = [name.strip() for name in args.strategy.split(",")]
    for name in strategies:  # every mistake of the command line before any output
        if name not in STRATEGIES:
            raise ConvsweepError(f"replay --strategy: unknown {name!r}: expected one of {', '.join(STRATEGIES)}")
    budget_for(args.budget, 1)
    if args.seeds < 1:
        raise ConvsweepError(f"replay --seeds: expected 1 or more, got {args.seeds}")
    if args.save:
        save_grids(args.save, experiment, grids, args.grids or "the database")
        print(f"wrote {len(grids)} grids of {experiment} to {args.save}")
    settings = sum(len(g.params) for g in grids)
    print(f"{experiment}: {len(grids)} grids, {settings:,} settings; budget {args.budget} of each grid, "
          f"{args.seeds} seeds, within {TOLERANCE:.0%} of each grid's best")
    rows = [judged_row(judge(grids, name, args.budget, args.seeds)) for name in strategies]
    print(render(JUDGED_COLUMNS, rows, args.format))
