"""What checking every timed pass on a fresh round costs, piece by piece, on the GPU: making a round (perturb_*),
shipping it to the host buffer the pass uploads from (pinned and pageable), the float64 truth of the whole batch,
the comparison, and the freshness ledger. Each is timed with CUDA events, median of `--repeats`, at LeNet-86's
batch (10000 by default) in each input format; docs/performance.md quotes the table.

    python scripts/truth_cost.py [--batch 10000] [--repeats 10] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from convsweep.inputs.formats import FORMATS
from convsweep.device.gpu import Gpu
from convsweep.inputs.batch import load_batch
from convsweep.model.network import load_network
from convsweep.base.paths import ROOT
from convsweep.device.rounds import Ledger, RoundMaker, round_sources
from convsweep.device.truth import Truth, TruthKernels


def timed(gpu, stream, work, repeats: int) -> float:
    """Median ms of `work()` between two events on `stream`, each waited for (a warm-up first)."""
    work()
    stream.sync()
    samples = []
    for _ in range(repeats):
        start = gpu.event(stream)
        work()
        end = gpu.event(stream)
        end.sync()
        samples.append(end - start)
    return statistics.median(samples)


def host_ms(work, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with Gpu() as gpu:
        stream = gpu.stream()
        kernels = TruthKernels(gpu, gpu.arch)
        for name in FORMATS:
            batch = load_batch(load_network(ROOT / "networks/lenet86.yaml"), "mnist5k", args.batch, name)
            truth = Truth(kernels, batch.network, batch.weights, stream)
            maker = RoundMaker(kernels, batch.shipped, args.batch, 12345, stream)
            made = gpu.alloc((args.batch, *batch.shipped.shape[1:]), batch.shipped.dtype)
            pinned = gpu.host_array(made.shape, made.dtype, "pinned")
            pageable = gpu.host_array(made.shape, made.dtype, "pageable")
            ref = gpu.alloc((args.batch, *truth.out_shape), np.float64)
            logits = gpu.alloc((args.batch, *truth.out_shape), np.float32)
            ledger = Ledger(kernels, len(batch.shipped), truth.out_shape)
            sources = round_sources(len(batch.shipped), args.batch, 1)
            row = {"input_format": name, "batch": args.batch, "shipped_MB": made.nbytes / 1e6}
            row["make_ms"] = timed(gpu, stream, lambda: maker.make(1, made, stream), args.repeats)
            row["ship_pinned_ms"] = timed(gpu, stream, lambda: gpu.download(made, pinned, stream), args.repeats)
            row["ship_pageable_ms"] = host_ms(lambda: (gpu.download(made, pageable, stream), stream.sync()),
                                              args.repeats)
            row["truth_ms"] = timed(gpu, stream, lambda: truth.forward(made, args.batch, ref, stream), args.repeats)
            row["compare_ms"] = host_ms(lambda: truth.compare(logits, ref, args.batch, stream), args.repeats)
            ledger.sight(ref, sources, stream, judge=False)
            row["ledger_ms"] = host_ms(lambda: ledger.sight(ref, sources, stream), args.repeats)
            row["per_pass_pinned_ms"] = (row["make_ms"] + row["ship_pinned_ms"] + row["truth_ms"] + row["compare_ms"]
                                         + row["ledger_ms"])
            rows.append(row)
            print(json.dumps(row), flush=True)
        device = gpu.name
    print(f"\n{device}, batch {args.batch}, median of {args.repeats} (ms)")
    keys = ["make_ms", "ship_pinned_ms", "ship_pageable_ms", "truth_ms", "compare_ms", "ledger_ms",
            "per_pass_pinned_ms"]
    print("| input | " + " | ".join(k[:-3] for k in keys) + " |")
    for row in rows:
        print(f"| {row['input_format']} | " + " | ".join(f"{row[k]:.3f}" for k in keys) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
