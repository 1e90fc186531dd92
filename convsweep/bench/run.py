"""`run_bench`: every phase of the bench in order, on one GPU, in one process (see the package
docstring), and the result dict that bench.report shapes."""
from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, cast

from convsweep.base.errors import failure_message
from convsweep.inputs.formats import FP32
from convsweep.inputs.batch import load_batch
from convsweep.base.numbers import median
from convsweep.base.progress import progress
from convsweep.device.provenance import environment
from convsweep.measure.runner import Backend
from .config import BenchConfig
from .cudnn import measure_cudnn, measure_matmul, torch_cuda
from .harness import run_harness
from .instead import measure_instead
from .measure import (Timing, best_variants, layer_inputs, measure_candidate,
                      measure_ceilings, measure_end_to_end, measure_forward, plan_from_best, plan_of)
from .report import build_result, params_text


@dataclass(frozen=True)
class BenchOptions:
    """What the command line may change: the batch and repeats (None: the bench file's), and the
    profilers of the harness jobs (none: no harness)."""

    batch: int | None = None
    repeats: int | None = None
    harness_profilers: tuple[str, ...] = ()
    ceilings_only: bool = False  # only the device's rates (copies, matmul): what the floors are reckoned at


def run_bench(config: BenchConfig, options: BenchOptions = BenchOptions(), backend: Backend = Backend(),
              load_torch: Callable = torch_cuda, log: Callable[[str], None] = lambda m: None) -> dict:
    """Measure everything and return build_result's dict. `backend` runs our kernels and
    `load_torch` finds PyTorch: tests pass numpy stand-ins for both."""
    network = config.network
    batch, repeats = options.batch or config.batch, options.repeats or config.repeats
    meas: dict[str, Any] = {
        "config": str(config.path), "batch": batch, "repeats": repeats, "warmup": config.warmup, "seed": config.seed,
        "bench_id": uuid.uuid4().hex, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    torch, torch_note = load_torch()  # imported before any timing, so the import is never inside a phase
    with backend.gpu() as gpu:
        meas["device"] = gpu.name
        meas["environment"] = environment(gpu)
        timing = Timing(batch, config.warmup, repeats, gpu.stream())
        log(f"ceilings: {config.copy_mib} MiB device copy, pinned H2D and D2H")
        meas["ceilings"] = measure_ceilings(gpu, timing, config.copy_mib << 20)
        if options.ceilings_only:
            if torch is not None:
                log("matmul ceilings (PyTorch)")
                meas["ceilings"]["matmul_TFLOPps"] = measure_matmul(torch, timing)
            else:
                log(f"matmul ceilings: {torch_note}: floors count bytes only")
            return build_result(meas, config.targets)
        meas["convs"] = []
        inputs_by_layer = {}
        total = sum(len(config.candidates.get(layer.name, ())) for layer in network.conv_layers)
        with progress(total=total, desc="bench candidates", unit="candidate") as shown:
            def say(message: str) -> None:  # on a terminal, a line above the bar rather than through it
                with shown.external_write_mode(file=sys.stderr):
                    log(message)

            for i, layer in enumerate(network.conv_layers):
                if layer.name not in config.candidates:
                    continue
                inputs = inputs_by_layer[layer.name] = layer_inputs(gpu, timing, layer, [config.seed, i],
                                                                    config.check_images)
                for cand in config.candidates[layer.name]:
                    say(f"{layer.name}: {cand.variant} {params_text(cand.params)}")
                    rec = measure_candidate(gpu, timing, network, cand, inputs, backend)
                    say(f"  {rec['status']}" + (f" {median(rec['samples_ms']):.4f} ms" if rec["samples_ms"] else "")
                        + (f" - {rec['error']}" if rec["error"] else ""))
                    meas["convs"].append(rec)
                    shown.update()
        missing = [layer.name for layer in network.conv_layers if layer.name not in config.candidates]
        best = None if missing else best_variants(meas["convs"])
        net_inputs = load_batch(network, config.dataset, batch)
        plans = ([plan_from_best(config, best)] if best else []) + [plan_of(cand) for cand in config.networks]
        forwards = []
        for plan in plans:
            log(f"forward on the device: {', '.join(v.name for v in plan.variants.values())}")
            forwards.append((plan, measure_forward(gpu, timing, config, plan, net_inputs, backend)))
        fastest = min((pf for pf in forwards if pf[1]["status"] == "ok"), default=None,
                      key=lambda pf: cast(float, median(pf[1]["samples_ms"])))  # an ok forward has samples
        if fastest is None:
            if forwards:  # every plan ran and failed: the first one's row says how
                why = "no forward plan ran correctly"
                meas["forward"] = forwards[0][1]
            else:
                why = (f"the bench file has no candidates for {', '.join(missing)}" if missing
                       else "a conv layer has no correct candidate")
                meas["forward"] = {"status": "skipped", "error": why, "samples_ms": []}
            meas["end_to_end"] = [{"status": "skipped", "error": why, "samples_ms": [], "streams": config.end_to_end["streams"]}]
        else:
            meas["forward"] = fastest[1]
            e2e, small = config.end_to_end, config.end_to_end["small_batch"]
            meas["end_to_end"], meas["end_to_end_small"] = [], []
            for fmt in e2e["inputs"]:  # each input format: what crosses the bus
                log(f"end to end, input {fmt}, {e2e['streams']} streams")
                shipped = net_inputs if fmt == FP32 else load_batch(network, config.dataset, batch, fmt)
                meas["end_to_end"].append(measure_end_to_end(gpu, timing, config, fastest[0], shipped, backend))
                if small:
                    log(f"end to end, input {fmt}, batch {small['batch']}")
                    meas["end_to_end_small"].append(measure_end_to_end(
                        gpu, timing, config, fastest[0], load_batch(network, config.dataset, small["batch"], fmt),
                        backend, small["chunk_images"]))
        meas["other_forwards"] = [rec for _, rec in forwards if rec is not meas["forward"]]
        gpu.device.sync()
        if torch is None:
            meas["cudnn"] = {"available": False, "note": torch_note}
        else:
            log("cuDNN (PyTorch)")
            try:
                meas["cudnn"] = measure_cudnn(torch, timing, config, inputs_by_layer, net_inputs)
                meas["ceilings"]["matmul_TFLOPps"] = measure_matmul(torch, timing)
            except Exception as e:
                meas["cudnn"] = {"available": False, "note": f"n/a (PyTorch failed: {failure_message(e)})"}
            torch.cuda.synchronize()
            try:
                meas["instead"] = measure_instead(torch, timing, config, net_inputs, log=log)
            except Exception as e:
                meas["instead"] = {"available": False, "note": f"n/a (PyTorch failed: {failure_message(e)})", "rows": []}
            torch.cuda.synchronize()
    if options.harness_profilers:
        meas["harness"] = run_harness(config, best, batch, options.harness_profilers, log=log)
    return build_result(meas, config.targets)
