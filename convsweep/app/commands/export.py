"""`convsweep export`: an experiment's stored results as Kernel Tuner's T4 results."""
from __future__ import annotations

from convsweep.app.kerneltuner import EXPORT_FORMATS, export_t4
from .common import add_db, add_experiment


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write an experiment's stored results as Kernel Tuner's T4 results",
                       description="Writes the newest measurement of every setting of an experiment in Kernel Tuner's "
                                   "T4 results schema (checked against the schema of the installed kernel_tuner): "
                                   "each result's configuration names the setting with flat keys (conv1.variant, "
                                   "conv1.BLOCK, network and the axes), its objective `time` is --metric in ms.")
    p.add_argument("--format", choices=EXPORT_FORMATS, default=EXPORT_FORMATS[0], help="(default: %(default)s)")
    add_experiment(p, "the experiment whose runs to write", required=True)
    p.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write")
    p.add_argument("--metric", default="op_time",
                   help="what `time` is: op_time (the conv layers' op times added up, per pass), forward_ms (the "
                        "whole pass), or a conv layer's name for its op time alone (default: %(default)s)")
    add_db(p)
    p.set_defaults(func=run)


def run(args) -> None:
    done = export_t4(args.db, args.experiment, args.out, metric=args.metric)
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(done.invalidity.items()))
    print(f"wrote {done.results} results of {args.experiment} ({kinds}) to {done.path} "
          f"as Kernel Tuner T4 {done.schema_version}, time = {args.metric}")
