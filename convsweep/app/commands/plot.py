"""`convsweep plot`: figures from the database as PNG files."""
from __future__ import annotations

from convsweep.figures import FIGURES, KINDS as PLOT_KINDS
from .common import add_db, add_experiment


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw figures from the database as PNG files",
                       description="Draws from the stored measurements, one PNG per kind: "
                                   + " ".join(f"{kind}: {FIGURES[kind].description}" for kind in PLOT_KINDS)
                                   + " Prints the files written, and the figures skipped for want of data with the "
                                   "reason.")
    p.add_argument("kind", choices=(*PLOT_KINDS, "all"), metavar="KIND",
                   help=f"one of {', '.join(PLOT_KINDS)}, or all")
    add_experiment(p, "plot this experiment (default: each stored one)")
    add_db(p)
    p.add_argument("--out", metavar="DIR",
                   help="the folder for the PNG files (default: results/<experiment>/figures, or results/figures "
                        "without --experiment, where files are named <experiment>-<kind>.png)")
    p.add_argument("--bench", metavar="FILE",
                   help="a `convsweep bench --json` file: its device copy bandwidth and matmul rates are the "
                        "roofline's ceilings (without it the roofline has none)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.figures import plot

    done = plot(args.kind, url=args.db, experiment=args.experiment, out=args.out, bench=args.bench)
    for path in done.paths:
        print(path)
    for kind, why in done.skipped:
        print(f"skipped {kind}: {why}")
