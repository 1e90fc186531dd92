"""cuDNN through PyTorch, on the same problems as ours: each conv layer and the whole network in
fp32 (TF32 off), TF32 and fp16 channels_last, plus matmul rates as the compute ceilings.

PyTorch is optional: `torch_cuda` imports it only when asked and says why it is unavailable in
the words the table prints; every PyTorch call happens after our own measurements finished.
"""
from __future__ import annotations

import contextlib
import functools
import dataclasses
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from convsweep.model.checks import normwise_error
from convsweep.base.errors import failure_message
from convsweep.model.network import Network
from convsweep.base.numbers import finite, median
from convsweep.measure.timing import TorchEvents, sample
from .config import BenchConfig
from convsweep.inputs.batch import Batch
from .measure import Timing
from .report import CUDNN_MODES


def torch_cuda() -> tuple[Any, str | None]:
    """(torch, None) when PyTorch can run on a GPU here, else (None, why) in the words the table prints."""
    try:
        import torch
    except ImportError:
        return None, "n/a (PyTorch not installed)"
    except Exception as e:  # a broken install must not stop the bench
        return None, f"n/a (PyTorch failed to import: {type(e).__name__})"
    try:
        if not torch.cuda.is_available():
            return None, "n/a (PyTorch has no CUDA device)"
    except Exception as e:
        return None, f"n/a (PyTorch CUDA: {type(e).__name__})"
    return torch, None


@contextlib.contextmanager
def torch_mode(torch, mode: str, benchmark: bool):
    """fp32: TF32 off; tf32: TF32 on (convolutions and matmuls); fp16: TF32 off (inputs are half)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark)
    cudnn.allow_tf32 = matmul.allow_tf32 = mode == "tf32"
    cudnn.benchmark = benchmark
    try:
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark = saved


def torch_samples(torch, stream, fn, timing: Timing) -> list[float]:
    """Like measure.event_samples, with torch.cuda.Event on a torch stream."""
    timer = TorchEvents(torch, stream, sync_each=False)
    return sample(timer, lambda marks: fn(), timing.rule(), warmup=timing.warmup).samples_ms


def torch_inputs(torch, mode: str, tensors: list):
    """The tensors as `mode` runs them: fp16 in half, 4-d ones channels_last."""
    if mode != "fp16":
        return tensors
    out = []
    for t in tensors:
        t = t.half()
        out.append(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
    return out


def torch_network(torch, network: Network, weights: dict, x) -> Callable[[], Any]:
    """The network as PyTorch calls on tensors `weights` (by key) and input `x`: a no-argument forward."""

    def forward():
        h = x
        for layer in network.layers:
            h = layer.kind.torch(torch, layer, weights, h)
        return h

    return forward


def network_on_device(torch, network_inputs: Batch) -> tuple[dict, Any]:
    """The network's weights (fp32, by key) and the batch's images as CUDA tensors."""
    weights = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).cuda()
               for k, v in network_inputs.weights.items()}
    return weights, torch.from_numpy(network_inputs.images).cuda()


def network_forward(torch, network: Network, weights: dict, x, mode: str) -> Callable[[], Any]:
    """The network as `mode` runs it (weights and input cast by torch_inputs): a no-argument forward.
    Call it inside torch_mode(mode)."""
    keys = list(weights)
    cast = dict(zip(keys, torch_inputs(torch, mode, [weights[k] for k in keys])))
    (x,) = torch_inputs(torch, mode, [x])
    return torch_network(torch, network, cast, x)


def measure_cudnn(torch, timing: Timing, config: BenchConfig, layer_inputs: dict, network_inputs: Batch) -> dict:
    """cuDNN on the same conv problems and the whole network, every mode, on a stream of its own
    (the timing's batch, warm-up and repeats; its stream is ours, not PyTorch's)."""
    F = torch.nn.functional
    stream = torch.cuda.Stream()
    out = {"available": True, "note": None, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "benchmark": config.cudnn_benchmark, "layers": {}, "forward": {}}
    for layer in config.network.conv_layers:
        li = layer_inputs.get(layer.name)
        if li is None:
            continue
        base = [torch.from_numpy(a).cuda() for a in (li.x, li.w, li.b)]
        for mode in CUDNN_MODES:
            try:
                with torch_mode(torch, mode, config.cudnn_benchmark):
                    x, w, b = torch_inputs(torch, mode, base)
                    torch.cuda.synchronize()
                    fn = functools.partial(F.conv2d, x, w, b, stride=layer.stride)
                    samples = torch_samples(torch, stream, fn, timing)
                    with torch.cuda.stream(stream):
                        y = fn()[torch.from_numpy(li.check_idx).cuda()].float().cpu().numpy()
                out["layers"].setdefault(layer.name, {})[mode] = {"samples_ms": samples,
                                                                  "max_rel_err": finite(normwise_error(y, li.ref))}
            except Exception as e:
                out["layers"].setdefault(layer.name, {})[mode] = {"samples_ms": [], "error": failure_message(e)}
            torch.cuda.synchronize()
        del base
        torch.cuda.empty_cache()

    ref = network_inputs.reference
    base_w, base_x = network_on_device(torch, network_inputs)
    for mode in CUDNN_MODES:
        try:
            with torch_mode(torch, mode, config.cudnn_benchmark):
                forward = network_forward(torch, config.network, base_w, base_x, mode)
                torch.cuda.synchronize()
                samples = torch_samples(torch, stream, forward, timing)
                with torch.cuda.stream(stream):
                    logits = forward().float().cpu().numpy()
            out["forward"][mode] = {"samples_ms": samples, "max_rel_err": finite(normwise_error(logits, ref))}
        except Exception as e:
            out["forward"][mode] = {"samples_ms": [], "error": failure_message(e)}
        torch.cuda.synchronize()
    del base_w, base_x
    torch.cuda.empty_cache()
    return out


def _matmul_rate(torch, stream, mode: str, n: int, timing: Timing) -> float:
    dtype = torch.float16 if mode == "fp16" else torch.float32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    with torch_mode(torch, mode, True):
        samples = torch_samples(torch, stream, lambda: a @ b,
                                dataclasses.replace(timing, warmup=max(timing.warmup, 1), repeats=min(timing.repeats, 10)))
    return 2 * n ** 3 / (cast(float, median(samples)) * 1e-3) / 1e12  # at least one timed repeat


def measure_matmul(torch, timing: Timing, n: int = 8192) -> dict:
    """TFLOP/s of an n x n x n matmul per mode: the compute ceilings beside the copy's memory ceiling."""
    stream = torch.cuda.Stream()
    rates: dict[str, float | None] = {}
    for mode in CUDNN_MODES:
        try:
            rates[mode] = _matmul_rate(torch, stream, mode, n, timing)
        except Exception:
            rates[mode] = None
        torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rates
