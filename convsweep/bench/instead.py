"""What a user would run instead of our kernels: the same network in PyTorch, replayed as a CUDA
graph (one launch for the whole forward: no per-layer launch overhead) and compiled with
`torch.compile(mode="max-autotune")` (Inductor's fused, autotuned kernels), in fp32 (TF32 off)
and fp16 channels_last. PyTorch eager is the cuDNN forward rows (cudnn.py).

Measured after everything of ours, like cuDNN, on the same images; each row fails on its own,
with its error, and never stops the bench.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from convsweep.model.checks import normwise_error
from convsweep.base.errors import failure_message
from convsweep.inputs.batch import Batch
from convsweep.base.numbers import finite
from .config import BenchConfig
from .cudnn import network_forward, network_on_device, torch_mode, torch_samples
from .measure import Timing
from .report import INSTEAD_MODES

CUDA_GRAPH = "CUDA graph"
TORCH_COMPILE = "torch.compile max-autotune"
GRAPH_WARMUP = 3  # eager passes before capture: cuDNN's algorithm search must not be captured


def _graphed(torch, forward: Callable[[], Any]) -> tuple[Callable[[], None], Callable[[], Any]]:
    """The forward captured once as a CUDA graph: (replay, the graph's output tensor)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = forward()
    return graph.replay, lambda: output


def _compiled(torch, forward: Callable[[], Any]) -> tuple[Callable[[], None], Callable[[], Any]]:
    """The forward through torch.compile(max-autotune), compiled and autotuned by its first call:
    (a call, the last call's output)."""
    compiled = torch.compile(forward, mode="max-autotune")
    last: dict[str, Any] = {"output": compiled()}

    def call() -> None:
        last["output"] = compiled()

    return call, lambda: last["output"]


WAYS = ((CUDA_GRAPH, _graphed), (TORCH_COMPILE, _compiled))


def measure_instead(torch, timing: Timing, config: BenchConfig, network_inputs: Batch,
                    log: Callable[[str], None] = lambda message: None) -> dict:
    """Every way x mode on the timing's batch: samples (events on the current stream), the error of
    the logits against float64 and how long the way took to get ready (capture, compile)."""
    base_w, base_x = network_on_device(torch, network_inputs)
    rows = []
    for mode in INSTEAD_MODES:
        for way, prepare in WAYS:
            log(f"PyTorch instead: {way}, {mode}" + (" (compiling and autotuning)" if way == TORCH_COMPILE else ""))
            row: dict[str, Any] = {"way": way, "mode": mode, "samples_ms": [], "max_rel_err": None,
                                   "prepare_s": None, "status": "ok", "error": None}
            try:
                with torch_mode(torch, mode, config.cudnn_benchmark):
                    forward = network_forward(torch, config.network, base_w, base_x, mode)
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    run, output = prepare(torch, forward)
                    torch.cuda.synchronize()
                    row["prepare_s"] = time.perf_counter() - started
                    row["samples_ms"] = torch_samples(torch, torch.cuda.current_stream(), run, timing)
                    logits = output().float().cpu().numpy()
                row["max_rel_err"] = finite(normwise_error(logits, network_inputs.reference))
            except Exception as e:
                row.update(status="failed", error=failure_message(e), samples_ms=[])
            rows.append(row)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    del base_w, base_x
    torch.cuda.empty_cache()
    return {"available": True, "note": None, "torch": torch.__version__, "rows": rows}
