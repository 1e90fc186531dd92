"""`convsweep bench`: the best variants beside cuDNN, the memory floor and the bench file's targets."""
from __future__ import annotations

import sys
from pathlib import Path

from convsweep.app.cliargs import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time the best variants beside cuDNN, the memory floor and the targets",
                       description="Times every candidate of the bench file per conv layer (checked against float64), "
                                   "the whole forward and the end-to-end pipeline with the best ones, and cuDNN on the "
                                   "same shapes when PyTorch is installed; prints ms, GB/s, GFLOP/s, the memory floor, "
                                   "ratios and the targets of the file.")
    p.add_argument("--config", default="bench/default.yaml", help="the bench file (default: %(default)s)")
    p.add_argument("--batch", type=positive_int, help="images per batch (default: the file's, 10000)")
    p.add_argument("--repeats", type=positive_int, help="timed runs per measurement (default: the file's, 20)")
    p.add_argument("--json", metavar="FILE", help="write every number (samples included) to FILE")
    p.add_argument("--harness", action="store_true",
                   help="also run a LeNet job twice with events and twice under nsys (if found) and judge the cached runs' total_s")
    p.add_argument("--ceilings-only", action="store_true", help="measure only the device's rates (copies each way, "
                   "matmul per unit), which the floors of its runs are reckoned at: seconds, not minutes")
    p.add_argument("--db", help="store the measured rates in this result store and reckon the floors of its runs on "
                                "this GPU at them (`convsweep ingest` of a --json file does the same)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.bench import BenchOptions, format_report, load_bench_config, run_bench
    from convsweep.base.fileio import write_json_atomic
    from convsweep.store import ingest_ceiling, open_store

    config = load_bench_config(args.config)
    options = BenchOptions(batch=args.batch, repeats=args.repeats,
                           harness_profilers=("events", "nsys") if args.harness else (), ceilings_only=args.ceilings_only)
    engine = open_store(args.db) if args.db else None  # first: a store that cannot be used fails before the GPU work
    result = run_bench(config, options, log=lambda message: print(f"bench: {message}", file=sys.stderr, flush=True))
    if args.json:
        write_json_atomic(Path(args.json), result)
    print(format_report(result))
    if engine is not None:
        ingest_ceiling(engine, result, args.json)
        print(f"stored the rates of {result['device']}: the floors of its runs are reckoned at them")
