"""`convsweep jobs`: the jobs a sweep file expands into, one line or one JSON spec each."""
from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("jobs", help="list the jobs of a sweep")
    p.add_argument("--config", default="experiments.yaml", help="the sweep file (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON job spec per line, with its job_id")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.sweep.config import expand_config, load_config

    for job in expand_config(load_config(args.config)):
        settings = job.settings()
        if args.json:
            print(json.dumps({**job.to_dict(), "sweep": job.sweep, "job_id": job.job_id, "settings": settings.chosen}))
        else:
            print(f"{job.experiment}\t{job.job_id}\t{settings.budget or len(settings.chosen)} of {settings.valid} "
                  f"settings{' (' + job.search['strategy'] + ')' if settings.guided else ''}")
