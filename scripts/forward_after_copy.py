"""Does what runs just before a forward change its time? The question behind the gap between the bench's
forward (events around back-to-back forwards of a batch already on the device) and a sweep job's op time
(nsys, each pass's forward right after its batch came up from the host): docs/performance.md, round five.

For each whole-network variant named, at the bench file's setting of it (bench/default.yaml `networks`, else
the registry defaults), the forward at the bench's batch (LeNet-86, mnist5k, 10000 images) between CUDA
events, median of 20 after 3 warm-up passes, in turn:
  back-to-back   as the bench times it;
  pageable       each right after the batch is uploaded from pageable host memory (a pageable job's pass);
  pinned         the same from pinned host memory;
  device-copy    each right after a device-to-device copy of the batch's bytes into another buffer (L2 full
                 of written lines that are not the batch's, no host involved);
  idle           each after the GPU sat idle for as long as a pageable upload of the batch takes (40 ms),
                 nothing copied: what is left of the after-upload cost when no bytes move;
and back-to-back again, so a drift of the GPU's clocks shows; ROUNDS (3) rounds, interleaved, the median of
the round medians reported. Every timed forward waits behind a gate (cuStreamWaitValue32 on a pinned flag)
that the host opens once the forward and its events are enqueued, so no event pair holds the host's launch.
The logits of the last pass are checked against float64 as the bench checks them.

    python scripts/forward_after_copy.py wgmma_fused_network fp16_fused_network
"""
import statistics
import sys
import time

import numpy as np

from convsweep.bench.config import load_bench_config
from convsweep.model.checks import check_logits
from convsweep.base.errors import ConvsweepError, failure_message
from convsweep.device.gpu import Gpu, _check
from convsweep.inputs.batch import load_batch
from convsweep.measure.runner import ConvPlan, GpuNetwork
from convsweep.model.variants import get_variant

CONDITIONS = ("back-to-back", "pageable", "pinned", "device-copy", "idle", "back-to-back")
IDLE_S = 0.040  # a pageable upload of the batch's 296 MB on the lent H100: 40.9 ms (a sweep job's h2d_ms)
WARMUP, REPEATS, ROUNDS = 3, 20, 3


class Gate:
    """A stream waits at the gate until the host opens it: work enqueued behind it starts together."""

    def __init__(self, gpu):
        self.flag = gpu.host_array((1,), np.uint32, "pinned")
        self.flag[0] = 0

    def close(self, stream) -> None:
        from cuda.bindings import driver

        _check(driver.cuStreamWaitValue32(int(stream.handle), self.flag.ctypes.data, int(self.flag[0]) + 1,
                                          driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")

    def open(self) -> None:
        self.flag[0] += 1


def forward_ms(gpu, stream, gate, forward, before) -> float:
    """Median ms of `forward(stream)` alone over REPEATS passes, `before(stream)` enqueued ahead of each."""
    times = []
    for i in range(WARMUP + REPEATS):
        before(stream)
        gate.close(stream)
        start = gpu.event(stream)
        forward(stream)
        end = gpu.event(stream)
        gate.open()
        stream.sync()
        if i >= WARMUP:
            times.append(end - start)  # CUDA events subtract to milliseconds
    return statistics.median(times)


def compare(gpu, stream, forwards: dict, pageable: np.ndarray, x) -> dict:
    """{name: [median of round medians per condition]} for forwards {name: forward(stream)} reading x."""
    pinned = gpu.host_array(pageable.shape, pageable.dtype, "pinned")
    pinned[...] = pageable
    scratch = gpu.alloc(x.shape, x.dtype)
    before = {"back-to-back": lambda s: None, "pageable": lambda s: gpu.upload(pageable, x, s),
              "pinned": lambda s: gpu.upload(pinned, x, s), "device-copy": lambda s: gpu.copy(scratch, x, s),
              "idle": lambda s: time.sleep(IDLE_S)}  # the last pass was synchronized: nothing runs meanwhile
    gate = Gate(gpu)
    rounds = {name: [[] for _ in CONDITIONS] for name in forwards}
    for _ in range(ROUNDS):
        for c, condition in enumerate(CONDITIONS):
            for name, forward in forwards.items():
                rounds[name][c].append(forward_ms(gpu, stream, gate, forward, before[condition]))
    return {name: [statistics.median(r) for r in per] for name, per in rounds.items()}


def table(batch: int, device: str, times: dict, statuses: dict) -> str:
    lines = [f"forward at batch {batch} on {device}, ms (median of {ROUNDS} rounds of a median of {REPEATS}), "
             "and against the first back-to-back:", "", "| variant | " + " | ".join(CONDITIONS) + " | logits |",
             "|---" * (len(CONDITIONS) + 2) + "|"]
    for name, row in times.items():
        cells = [f"{t:.4f} ({100 * (t / row[0] - 1):+.1f}%)" for t in row]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {statuses[name]} |")
    return "\n".join(lines)


def main(names: list[str]) -> None:
    variants = {name: get_variant(name) for name in names}  # a wrong name says so before the GPU opens
    config = load_bench_config()
    network, batch = config.network, config.batch
    inputs = load_batch(network, config.dataset, batch)
    with Gpu() as gpu:
        stream = gpu.stream()
        pageable = np.ascontiguousarray(inputs.images)
        x = gpu.to_device(pageable, stream)
        logits = gpu.alloc((batch, *network.layers[-1].out_shape), network.dtype)
        nets = {}
        for name, variant in variants.items():
            params = next((c.resolved for c in config.networks if c.variant == name), variant.defaults())  # the bench's
            nets[name] = GpuNetwork(gpu, network, inputs.weights, ConvPlan({"conv1": variant}, {"conv1": params}), 1, batch)
        forwards = {name: (lambda s, net=net: net.enqueue(s, net.lanes[0], x, logits, batch)) for name, net in nets.items()}
        times = compare(gpu, stream, forwards, pageable, x)
        statuses = {}
        for name, forward in forwards.items():
            gpu.fill(logits, 0xFF, stream)
            forward(stream)
            out = np.empty(logits.shape, logits.dtype)
            gpu.download(logits, out, stream)
            stream.sync()
            statuses[name] = check_logits(out, inputs.reference, inputs.dataset.labels, inputs.idx, [variants[name]]).status
        print(table(batch, gpu.name, times, statuses))


if __name__ == "__main__":
    try:
        main(sys.argv[1:] or ["wgmma_fused_network"])
    except ConvsweepError as e:  # an unknown variant, no GPU, a kernel that does not build: one line
        sys.exit(f"forward_after_copy: {failure_message(e)}")
