"""`convsweep report`: an experiment's tables, seeds-format report and figures."""
from __future__ import annotations

from pathlib import Path

from convsweep.base.errors import ConvsweepError
from .common import add_db, add_experiment


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write an experiment's tables, seeds-format report and figures",
                       description="Writes, for one experiment, any of: its runs as one Markdown table (--out, "
                                   "summary.md); the seeds-format report (--markdown report.md, --html for the same "
                                   "as one self-contained page): per variant the seeds' table, the speedup over the "
                                   "previous variant and over naive, what Nsight Compute says bounds each conv "
                                   "kernel, and the figures; the seeds' and why tables as CSV (--tables DIR); and, "
                                   "with --draw, its figures first.")
    add_experiment(p, "the experiment of experiments.yaml to report", required=True)
    add_db(p)
    p.add_argument("--out", help="write the runs as one Markdown table to this file (summary.md)")
    p.add_argument("--markdown", metavar="FILE", help="write the seeds-format report as Markdown (report.md); "
                                                      "figures are linked relative to it")
    p.add_argument("--html", metavar="FILE", help="write the same report as one HTML page, figures embedded")
    p.add_argument("--tables", metavar="DIR", help="write seeds.csv and why.csv (the Nsight Compute evidence) to DIR")
    p.add_argument("--figures", metavar="DIR",
                   help="the experiment's figures (default: results/<experiment>/figures, where `convsweep plot` "
                        "draws them)")
    p.add_argument("--draw", action="store_true",
                   help="draw every figure the database has data for into --figures first (`convsweep plot all`); "
                        "a kind without data is skipped with the reason, none drawn is no error")
    p.add_argument("--bench", metavar="FILE",
                   help="with --draw: a `convsweep bench --json` file, whose copy bandwidth and matmul rates are the "
                        "roofline's ceilings")
    p.add_argument("--allow-empty", action="store_true",
                   help="an experiment with no run stored gets a report saying so instead of an error (the end of a "
                        "sweep none of whose jobs finished writes one, so `snakemake --report` finds its files)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep import report
    from convsweep.base.fileio import checked_directory
    from convsweep.figures import draw
    from convsweep.base.paths import RESULTS_DIR, results_directory

    if not (args.out or args.markdown or args.html or args.tables or args.draw):
        raise ConvsweepError("report: nothing to write: give --out, --markdown, --html, --tables or --draw")
    figures = Path(args.figures) if args.figures else checked_directory(
        results_directory(args.experiment, "figures"), below=RESULTS_DIR)
    if args.draw:
        drawn = draw(args.db, args.experiment, figures, bench=args.bench)
        for path in drawn.paths:
            print(path)
        for kind, why in drawn.skipped:
            print(f"skipped {kind}: {why}")
    written = report.write(args.db, args.experiment, markdown=Path(args.markdown) if args.markdown else None,
                           page=Path(args.html) if args.html else None,
                           tables=Path(args.tables) if args.tables else None, figures_dir=figures,
                           summary=Path(args.out) if args.out else None, allow_empty=args.allow_empty)
    for path in written.paths:
        print(path)
