"""Redraw the figures README shows (docs/img/op-time.png, docs/img/roofline.png) from a store holding a real
GPU run of today's default sweep, with convsweep's own figure code (`convsweep plot`).

On the GPU machine, from the checkout, after the default sweep and a bench run on the same GPU:

    snakemake                                        # the default sweep (experiments.yaml) into db/results.sqlite
    convsweep bench --json docs/bench-h100.json      # the device's copy and matmul ceilings, for the roofline
    python scripts/readme_images.py [--db PATH] [--bench FILE] [--out DIR]

It draws nothing and says why in one line (exit status 2) when the store lacks an ok run of a GPU variant of the
default experiment at one of its batches (experiments.yaml says which), when the runs come from several GPUs, or
when the bench file measured another GPU than the runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from convsweep.sweep.config import expand_config, load_config, variant_label
from convsweep.base.errors import ConvsweepError
from convsweep.base.paths import ROOT
from convsweep.model.variants import load_registry

EXPERIMENT = "lenet86-baseline"  # the default sweep's experiment whose figures README shows
KINDS = ("op-time", "roofline")  # README's figures of it, each docs/img/<kind>.png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=str(ROOT / "db" / "results.sqlite"), metavar="PATH",
                        help="the SQLite file of the GPU run, or an SQLAlchemy URL (default: the checkout's "
                             "db/results.sqlite)")
    parser.add_argument("--bench", default=str(ROOT / "docs" / "bench-h100.json"), metavar="FILE",
                        help="a `convsweep bench --json` file of the same GPU: the roofline's ceilings "
                             "(default: the checkout's docs/bench-h100.json)")
    parser.add_argument("--experiments", default=str(ROOT / "experiments.yaml"), metavar="FILE",
                        help="the default sweep, which names the variants and batches the figures must show "
                             "(default: the checkout's experiments.yaml)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), metavar="DIR",
                        help="where the PNG files go (default: the checkout's docs/img)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    # The roofline's caption names its bench file: the checkout's own by its path there (docs/bench-h100.json).
    bench = Path(args.bench).resolve()
    bench = bench.relative_to(ROOT) if bench.is_relative_to(ROOT) else bench
    try:
        url = store_url(args.db)
        gpu = check_store(url, wanted_runs(args.experiments), args.db)
        os.chdir(ROOT)
        check_bench(str(bench), gpu)
        for path in draw(url, str(bench), out):
            print(path)
    except ConvsweepError as e:
        print(f"readme_images: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


def store_url(db: str) -> str:
    """An SQLAlchemy URL as it is; a path as the URL of an SQLite file that must exist (opening a missing one
    would make an empty store)."""
    if "://" in db:
        return db
    if not Path(db).is_file():
        raise ConvsweepError(f"{db}: no such store: run the default sweep (`snakemake`) on a GPU first")
    return f"sqlite:///{Path(db).resolve()}"


def wanted_runs(experiments: str) -> set[tuple[str, int]]:
    """(variant, batch) of every GPU job of the default experiment, variant named as the store names it."""
    config = load_config(experiments)
    if EXPERIMENT not in config.experiments:
        raise ConvsweepError(f"{experiments}: no experiment {EXPERIMENT!r}, whose figures README shows")
    registry = load_registry()
    return {(variant_label(job.variants), job.batch) for job in expand_config(config, experiments)
            if job.experiment == EXPERIMENT and not all(registry[v].is_cpu for v in job.variants.values())}


def check_store(url: str, wanted: set[tuple[str, int]], where: str) -> str:
    """The one GPU the default experiment's ok GPU runs were measured on; ConvsweepError naming what is missing."""
    from convsweep.analysis.query import fetch_dicts

    _, rows = fetch_dicts(url, """
        SELECT r.variant, r.batch, e.gpu
        FROM latest_run r JOIN environment e ON e.id = r.environment_id
        WHERE r.experiment = :experiment AND r.status = 'ok' AND e.gpu IS NOT NULL""", {"experiment": EXPERIMENT})
    found = {(row["variant"], row["batch"]): row["gpu"] for row in rows if (row["variant"], row["batch"]) in wanted}
    missing = sorted(wanted - set(found))
    if missing:
        by_variant: dict[str, list[int]] = {}
        for variant, batch in missing:
            by_variant.setdefault(variant, []).append(batch)
        lacking = "; ".join(f"{v} (batch {', '.join(map(str, sorted(b)))})" for v, b in sorted(by_variant.items()))
        raise ConvsweepError(f"{where} lacks ok GPU runs of the default sweep's {EXPERIMENT}: {lacking}; run the "
                             f"default sweep (`snakemake`) on a GPU first")
    gpus = sorted(set(found.values()))
    if len(gpus) > 1:
        raise ConvsweepError(f"{where}: the runs of {EXPERIMENT} come from several GPUs ({', '.join(gpus)}); "
                             f"README's figures show one")
    return gpus[0]


def check_bench(bench: str, gpu: str) -> None:
    """The bench file's ceilings must be the runs' GPU's."""
    from convsweep.analysis.reading import load_ceilings

    device = load_ceilings(bench).device
    if device != gpu:
        raise ConvsweepError(f"--bench {bench}: measured on {device or 'an unnamed device'}, the runs on {gpu}: "
                             f"run `convsweep bench --json FILE` on that GPU and pass --bench FILE")


def draw(url: str, bench: str, out: Path) -> list[Path]:
    """README's figures of the default experiment, drawn by `convsweep plot` into `out`."""
    from convsweep.figures import plot

    return [path for kind in KINDS for path in plot(kind, url=url, experiment=EXPERIMENT, out=out, bench=bench).paths]


if __name__ == "__main__":
    sys.exit(main())
