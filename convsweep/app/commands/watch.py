"""`convsweep watch`: on each save, Snakemake, then compare the jobs it re-ran."""
from __future__ import annotations

from convsweep.app.cliargs import positive_int
from .common import add_experiment


def add_parser(sub) -> None:
    p = sub.add_parser("watch",
                       help="on each save of a kernel or the sweep file: snakemake, then compare the jobs it re-ran",
                       description="Watches kernels/ (.cu, .cuh, variants.yaml) and the sweep file; on each save runs "
                                   "Snakemake as `snakemake` would, a line per finished job, then `compare previous "
                                   "latest` over the jobs it measured (never a gate), until Ctrl-C.")
    p.add_argument("--configfile", metavar="FILE", help="the sweep file, as snakemake's (default: experiments.yaml)")
    add_experiment(p, "run and compare this experiment of the sweep file alone")
    p.add_argument("--cores", type=positive_int, help="snakemake --cores (default: the profile's)")
    p.add_argument("--cpu", action="store_true", help="also compare the jobs timed on the CPU, as compare --cpu")
    p.add_argument("--threshold", type=float, default=0.05, help="as compare's (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.app.watch import WatchOptions, watch

    watch(WatchOptions(args.configfile, args.experiment, args.cores, args.cpu, args.threshold))
