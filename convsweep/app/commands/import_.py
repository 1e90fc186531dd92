"""`convsweep import`: a Kernel Tuner cache file's configurations stored as runs, marked as imported (`import_`: the
command's name is a keyword)."""
from __future__ import annotations

import sys

from convsweep.app.cliargs import positive_int
from convsweep.base.errors import ConvsweepError, StoreUnavailable, failure_message
from convsweep.app.kerneltuner import DEFAULT_EXPERIMENT, DEFAULT_NETWORK, import_cache
from .common import add_db, add_experiment


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="store a Kernel Tuner cache file's configurations as runs, marked as imported",
                       description="Stores each configuration of a Kernel Tuner cache file as a run of one conv "
                                   "layer (its time the layer's op time; one Kernel Tuner could not measure, failed "
                                   "with the reason), marked as imported from the file, with the device it names. "
                                   "The variant, layer and batch are read from the cache's kernel_name and "
                                   "problem_size (the kernel's output, one thread per element) where not given. "
                                   "Importing a file again stores nothing twice. A file that cannot be imported "
                                   "is one line; the others go on, and the exit status is 1.")
    p.add_argument("cache", nargs="+", help="the cache files (tune_kernel's cache=), each imported on its own: one "
                                            "that cannot be is one line, and the others go on")
    p.add_argument("--variant", help="the variant the kernel is (default: the one kernel_name names)")
    p.add_argument("--layer", help="the conv layer it computed (default: the one problem_size is the output of)")
    p.add_argument("--batch", type=positive_int, help="the images per pass (default: problem_size's)")
    p.add_argument("--network", default=DEFAULT_NETWORK, help="the network of the layer (default: %(default)s)")
    add_experiment(p, "the experiment to store the runs under", default=DEFAULT_EXPERIMENT)
    add_db(p)
    p.set_defaults(func=run)


def run(args) -> None:
    """Each cache on its own (its own transaction): a bad one is its line on stderr and the others go on, the
    exit status 1 at the end, as `convsweep ingest` does; a store that cannot be used at all stops them all."""
    failed = 0
    for cache in args.cache:
        try:
            done = import_cache(args.db, cache, experiment=args.experiment, network=args.network,
                                variant=args.variant, layer=args.layer, batch=args.batch)
        except StoreUnavailable:
            raise
        except ConvsweepError as e:
            failed += 1
            print(f"convsweep: {failure_message(e)}", file=sys.stderr)
            continue
        k = done.kernel
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(done.by_status.items()))
        print(f"{cache}: {k.variant} at {k.layer} of {k.network}, batch {k.batch}, experiment {args.experiment}: "
              f"{done.added} runs stored" + (f" ({statuses})" if statuses else "")
              + f", {done.unchanged} already stored")
    if failed:
        raise SystemExit(1)
