"""Does what runs just before a forward change its time? The question behind the gap between the bench's
forward (events around back-to-back forwards of a batch already on the device) and a sweep job's op time
(nsys, each pass's forward right after its batch came up from the host): docs/performance.md, round five.

For each whole-network variant named, at the bench file's setting of it (bench/default.yaml `networks`, else
the registry defaults), the forward at the bench's batch (LeNet-86, mnist5k, 10000 images) between CUDA events, median of 20 after 3 warm-up passes, in turn:
  back-to-back   as the bench times it;
  pageable       each right after the batch is uploaded from pageable host memory (a pageable job's pass);
  pinned         the same from pinned host memory;
  device-copy    each right after a device-to-device copy of the batch's bytes (L2 full of written lines,
                 no host involved);
and back-to-back again, so a drift of the GPU's clocks shows. The logits of the last pass are checked
against float64 as the bench checks them.

    python scripts/forward_after_copy.py wgmma_fused_network fp16_fused_network
"""
import statistics
import sys

import numpy as np

from convsweep.bench.config import load_bench_config
from convsweep.checks import check_logits
from convsweep.gpu import Gpu
from convsweep.inputs import load_batch
from convsweep.runner import ConvPlan, GpuNetwork
from convsweep.variants import get_variant

CONDITIONS = ("back-to-back", "pageable", "pinned", "device-copy", "back-to-back")
WARMUP, REPEATS = 3, 20


def forward_ms(gpu, stream, net, x, logits, batch: int, before) -> float:
    """Median ms of the forward alone over REPEATS passes, `before(stream)` enqueued ahead of each."""
    times = []
    for i in range(WARMUP + REPEATS):
        before(stream)
        start = gpu.event(stream)
        net.enqueue(stream, net.lanes[0], x, logits, batch)
        end = gpu.event(stream)
        stream.sync()
        if i >= WARMUP:
            times.append(end - start)  # CUDA events subtract to milliseconds
    return statistics.median(times)


def main(names: list[str]) -> None:
    config = load_bench_config()
    network, batch = config.network, config.batch
    inputs = load_batch(network, config.dataset, batch)
    rows = []
    with Gpu() as gpu:
        stream = gpu.stream()
        pageable = np.ascontiguousarray(inputs.images)
        pinned = gpu.host_array(pageable.shape, pageable.dtype, "pinned")
        pinned[...] = pageable
        x = gpu.to_device(pageable, stream)
        scratch = gpu.alloc(x.shape, x.dtype)
        logits = gpu.alloc((batch, *network.layers[-1].out_shape), network.dtype)
        before = {"back-to-back": lambda s: None, "pageable": lambda s: gpu.upload(pageable, x, s),
                  "pinned": lambda s: gpu.upload(pinned, x, s), "device-copy": lambda s: gpu.copy(scratch, x, s)}
        device = gpu.name
        for name in names:
            variant = get_variant(name)
            params = next((c.resolved for c in config.networks if c.variant == name), variant.defaults())  # the bench's
            net = GpuNetwork(gpu, network, inputs.weights, ConvPlan({"conv1": variant}, {"conv1": params}), 1, batch)
            times = [forward_ms(gpu, stream, net, x, logits, batch, before[c]) for c in CONDITIONS]
            out = np.empty(logits.shape, logits.dtype)
            gpu.download(logits, out, stream)
            stream.sync()
            status = check_logits(out, inputs.reference, inputs.dataset.labels, inputs.idx, [variant]).status
            rows.append((name, times, status))
    print(f"forward at batch {batch} on {device}, ms (median of {REPEATS}), and against the first back-to-back:\n")
    print("| variant | " + " | ".join(CONDITIONS) + " | logits |")
    print("|---" * (len(CONDITIONS) + 2) + "|")
    for name, times, status in rows:
        cells = [f"{t:.4f} ({100 * (t / times[0] - 1):+.1f}%)" for t in times]
        print(f"| {name} | " + " | ".join(cells) + f" | {status} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["wgmma_fused_network"])
