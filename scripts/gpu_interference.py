"""Does another process's CUDA start-up slow a job's timed kernels? The numbers behind
docs/throughput.md, and the reason a job takes its GPU's lock before it starts CUDA.

A lone measurement (naive at batch 1000, pinned, CUDA events, many passes) runs while a thread
starts short processes over and over that, per condition:
  init   start the CUDA driver only (cuInit, a device's name: no context);
  nvml   open NVML and read what a job reads (UUID, driver, clocks, energy, slowdowns);
  ctx    open a CUDA context;
  alloc  also allocate 40 MB on the device and 31 MB of pinned host memory, and fill them;
  nsys   do that under `nsys profile`;
  quiet  nothing.
It prints, per condition, conv2's op time over the passes against the first condition's median.

    python scripts/gpu_interference.py quiet,ctx,alloc,nsys,quiet 1200
    python scripts/gpu_interference.py quiet,init,nvml,quiet 1200
"""
import statistics
import subprocess
import sys
import threading
import time

from convsweep.sweep.config import RunSpec
from convsweep.measure.settings import measure

CONTEXT = ("from cuda.bindings import driver as d; d.cuInit(0); dev = d.cuDeviceGet(0)[1]; "
           "c = d.cuDevicePrimaryCtxRetain(dev)[1]; d.cuCtxSetCurrent(c); d.cuCtxSynchronize()")
ALLOCATE = CONTEXT + ("; p = d.cuMemAlloc(40 << 20)[1]; d.cuMemsetD8(p, 255, 40 << 20); "
                      "h = d.cuMemHostAlloc(31 << 20, 0)[1]; d.cuCtxSynchronize()")
DRIVER = "from cuda.bindings import driver as d; d.cuInit(0); dev = d.cuDeviceGet(0)[1]; d.cuDeviceGetName(64, dev)"
NVML = ("import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); n.nvmlDeviceGetUUID(h); "
        "n.nvmlSystemGetDriverVersion(); n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM); "
        "n.nvmlDeviceGetTotalEnergyConsumption(h); n.nvmlDeviceGetCurrentClocksEventReasons(h); n.nvmlShutdown()")
COMMANDS = {"init": [sys.executable, "-c", DRIVER], "nvml": [sys.executable, "-c", NVML],
            "ctx": [sys.executable, "-c", CONTEXT], "alloc": [sys.executable, "-c", ALLOCATE],
            "nsys": ["nsys", "profile", "-t", "cuda,nvtx", "-o", "/tmp/gpu-interference", "--force-overwrite", "true",
                     sys.executable, "-c", ALLOCATE]}


def interfere(condition: str, stop: threading.Event, started: list[int]) -> None:
    while not stop.is_set():
        subprocess.run(COMMANDS[condition], capture_output=True)
        started[0] += 1


def main(conditions: list[str], passes: int) -> None:
    run = RunSpec(experiment="interference", network="networks/lenet86.yaml", dataset="mnist5k",
                  variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}}, batch=1000,
                  streams=1, host_memory="pinned", repeats=passes, warmup=2, profiler="events", energy_window_s=0)
    baseline = None
    for condition in conditions:
        stop, started, thread = threading.Event(), [0], None
        if condition != "quiet":
            thread = threading.Thread(target=interfere, args=(condition, stop, started))
            thread.start()
            time.sleep(0.3)
        t = time.perf_counter()
        measured = measure(run)
        stop.set()
        if thread is not None:
            thread.join()
        ops = sorted(s["value"] for s in measured["samples"] if s["metric"] == "op_time_ms" and s["layer"] == "conv2")
        median = statistics.median(ops)
        baseline = baseline or median
        slower = sum(v > 1.05 * baseline for v in ops)
        print(f"{condition:6s} {len(ops)} passes in {time.perf_counter() - t:.1f} s beside {started[0]} processes: "
              f"median {median:.4f} ms, p99 {ops[int(0.99 * len(ops))]:.4f}, slowest {ops[-1] / baseline:.2f}x; "
              f"{slower} passes more than 5% over the baseline", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), int(sys.argv[2]) if len(sys.argv) > 2 else 800)
