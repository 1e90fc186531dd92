"""`convsweep bench`: our best variants beside cuDNN, the memory floor and the targets, in one process.

What it measures, in this order, on one GPU and in one process (every phase ends synchronized):

1. ceilings: a device-to-device copy (bytes read + written per second: the rate every memory
   floor is divided by) and a pinned host-to-device copy (the end-to-end floor's rate);
2. every conv candidate of `bench/default.yaml`: fixed-seed random inputs on the device, the
   output poisoned (NaN) and one run checked against float64 numpy, warm-up, `repeats` runs each
   between two events on one stream, median; the output is checked again after timing (an error
   that moves between runs is a race). A wrong or failing candidate is never "best";
3. the whole forward with the best candidate per layer, real images already on the device;
4. end to end: pinned host images -> host logits on S streams, the same pipeline jobs run
   (runner.pipeline_pass), events from the first H2D to the last D2H;
5. cuDNN, when PyTorch with CUDA is importable: the same layers on the same inputs (fp32 with
   TF32 off, TF32, fp16 channels_last) and the whole network, timed with torch.cuda.Event on a
   stream of its own after everything of ours finished; plus matmul rates (the FLOP ceilings);
6. with --harness, after the GPU is released: `convsweep run-job` twice with events and twice
   under nsys; the second run of each hits the compile cache and its total_s is judged.

Everything measured lands in one dict; `build_result` derives rows, floors, ratios and verdicts
from it and `format_report` prints them. Both are pure and tested with fake numbers.
PyTorch is optional: it is imported only here, only when present.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .config import ROOT
from .errors import ConfigError, ConvsweepError
from .gpu import HOST_MEMORY_KINDS
from .variants import TOLERANCE
from .yamlio import read_yaml_file

FORMAT = 1
DEFAULT_CONFIG = "bench/default.yaml"
CUDNN_MODES = ("fp32", "tf32", "fp16")  # cuDNN columns; a variant is compared with the mode of its precision class
SPECIAL_ROWS = ("forward", "end_to_end", "harness_events", "harness_nsys")  # target keys besides conv layers
_KEYS = {"network", "dataset", "batch", "repeats", "warmup", "seed", "check_images", "copy_mib", "cudnn_benchmark",
         "candidates", "end_to_end", "harness", "targets"}
_PRECISION_ORDER = ("fp32", "tf32", "fp16")  # loosest last: a mixed network is judged by its loosest layer


# -- the bench file ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    layer: str
    variant: str
    params: dict  # as written in the file
    resolved: dict  # every tunable, defaults filled in


@dataclass(frozen=True)
class BenchConfig:
    path: Path
    network_path: Path
    network: Any  # convsweep.network.Network
    dataset: str
    batch: int
    repeats: int
    warmup: int
    seed: int
    check_images: int
    copy_mib: int
    cudnn_benchmark: bool
    candidates: dict  # conv layer -> [Candidate]
    end_to_end: dict  # streams, host_memory, chunk_images
    harness: dict  # repeats, warmup
    targets: dict  # batch, device, ms


def _int(value, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _positive(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _mapping(value, where: str, allowed: set[str]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    unknown = sorted(set(value) - allowed, key=str)
    if unknown:
        key = f"{where} {unknown[0]}" if where.endswith(":") else f"{where}.{unknown[0]}"
        raise ConfigError(f"{key}: unknown key (expected one of {', '.join(sorted(allowed))})")
    return value


def load_bench_config(path: str | Path = DEFAULT_CONFIG) -> BenchConfig:
    """Read and check a bench file; every problem is one ConfigError line naming file and key."""
    from .network import load_network
    from .runner import conv_shape
    from .variants import load_registry

    path = Path(path)
    if not path.is_file() and not path.is_absolute() and (ROOT / path).is_file():
        path = ROOT / path
    raw = read_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with a 'candidates' key, got {type(raw).__name__}")
    f = str(path)
    _mapping(raw, f"{f}:", _KEYS)
    net_value = raw.get("network", "networks/lenet86.yaml")
    if not isinstance(net_value, str) or not net_value:
        raise ConfigError(f"{f}: network: expected a path to a network YAML, got {net_value!r}")
    net_path = Path(net_value)
    if not net_path.is_absolute():
        net_path = path.parent / net_path if (path.parent / net_path).is_file() else ROOT / net_path
    if not net_path.is_file():
        raise ConfigError(f"{f}: network: expected an existing network YAML, got {net_value!r}")
    network = load_network(net_path)
    if network.dtype != "float32":
        raise ConfigError(f"{f}: network: expected a float32 network (the bench times float32 kernels), "
                          f"got {network.dtype} in {net_value}")
    dataset = raw.get("dataset", "mnist5k")
    if not isinstance(dataset, str):
        raise ConfigError(f"{f}: dataset: expected a dataset name, got {dataset!r}")
    cudnn_benchmark = raw.get("cudnn_benchmark", True)
    if not isinstance(cudnn_benchmark, bool):
        raise ConfigError(f"{f}: cudnn_benchmark: expected true or false, got {cudnn_benchmark!r}")
    batch = _int(raw.get("batch", 10000), f"{f}: batch")
    check_images = _int(raw.get("check_images", 8), f"{f}: check_images")

    conv_names = [layer.name for layer in network.conv_layers]
    raw_candidates = raw.get("candidates")
    if not isinstance(raw_candidates, dict) or not raw_candidates:
        raise ConfigError(f"{f}: candidates: expected a mapping of conv layer -> list of variants, got {raw_candidates!r}")
    registry = load_registry()
    candidates: dict[str, list[Candidate]] = {}
    for layer_name, entries in raw_candidates.items():
        where = f"{f}: candidates.{layer_name}"
        if layer_name not in conv_names:
            raise ConfigError(f"{where}: expected a conv layer of {network.name} ({', '.join(conv_names)})")
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: expected a non-empty list of {{variant: name, params: {{...}}}}, got {entries!r}")
        layer = network.layer(layer_name)
        candidates[layer_name] = []
        for i, entry in enumerate(entries):
            at = f"{where}[{i}]"
            if isinstance(entry, str):  # shorthand: a bare variant name
                entry = {"variant": entry}
            entry = _mapping(entry, at, {"variant", "params"})
            name = entry.get("variant")
            if name not in registry:
                raise ConfigError(f"{at}.variant: unknown variant {name!r} (known: {', '.join(sorted(registry))})")
            var = registry[name]
            if var.is_cpu:
                raise ConfigError(f"{at}.variant: expected a GPU variant, got {name!r} (it runs on the CPU)")
            params = entry.get("params") or {}
            if not isinstance(params, dict):
                raise ConfigError(f"{at}.params: expected a mapping of tunables, got {params!r}")
            resolved = var.resolve_params(params, f"{at}.params")
            try:
                fused = network.fused_layers(layer_name, var.fuses) if var.fuses else ()
            except ConvsweepError as e:
                raise ConfigError(f"{at}.variant: {e}") from None
            try:
                var.check_shape(conv_shape(layer, 1, network.dtype, fused), resolved)
            except ConvsweepError as e:
                raise ConfigError(f"{at}.variant: {e}") from None
            candidates[layer_name].append(Candidate(layer_name, name, dict(params), resolved))

    e2e = _mapping(raw.get("end_to_end"), f"{f}: end_to_end", {"streams", "host_memory", "chunk_images"})
    host_memory = e2e.get("host_memory", "pinned")
    if host_memory not in HOST_MEMORY_KINDS:
        raise ConfigError(f"{f}: end_to_end.host_memory: expected one of {', '.join(HOST_MEMORY_KINDS)}, got {host_memory!r}")
    chunk = e2e.get("chunk_images")
    end_to_end = {"streams": _int(e2e.get("streams", 4), f"{f}: end_to_end.streams"), "host_memory": host_memory,
                  "chunk_images": None if chunk is None else _int(chunk, f"{f}: end_to_end.chunk_images")}
    h = _mapping(raw.get("harness"), f"{f}: harness", {"repeats", "warmup"})
    harness = {"repeats": _int(h.get("repeats", 5), f"{f}: harness.repeats"),
               "warmup": _int(h.get("warmup", 1), f"{f}: harness.warmup", 0)}

    t = _mapping(raw.get("targets"), f"{f}: targets", {"batch", "device", "ms"})
    device = t.get("device")
    if device is not None and not isinstance(device, str):
        raise ConfigError(f"{f}: targets.device: expected a GPU name (e.g. H100), got {device!r}")
    ms = {}
    for key, value in _mapping(t.get("ms"), f"{f}: targets.ms", set(conv_names) | set(SPECIAL_ROWS)).items():
        where = f"{f}: targets.ms.{key}"
        if isinstance(value, dict) and key in conv_names:
            _mapping(value, where, set(TOLERANCE))
            ms[key] = {p: _positive(v, f"{where}.{p}") for p, v in value.items()}
        else:
            ms[key] = _positive(value, where)
    targets = {"batch": _int(t.get("batch", batch), f"{f}: targets.batch"), "device": device, "ms": ms}

    return BenchConfig(path=path, network_path=net_path, network=network, dataset=dataset, batch=batch,
                       repeats=_int(raw.get("repeats", 20), f"{f}: repeats"),
                       warmup=_int(raw.get("warmup", 3), f"{f}: warmup", 0),
                       seed=_int(raw.get("seed", 0), f"{f}: seed", 0), check_images=check_images,
                       copy_mib=_int(raw.get("copy_mib", 1024), f"{f}: copy_mib"), cudnn_benchmark=cudnn_benchmark,
                       candidates=candidates, end_to_end=end_to_end, harness=harness, targets=targets)


# -- pure arithmetic -----------------------------------------------------------------------------
def median(values) -> float | None:
    values = [v for v in values or () if v is not None]
    return statistics.median(values) if values else None


def copy_rate(nbytes: int, ms: float, read_and_write: bool = True) -> float:
    """Bytes per second of a copy of `nbytes` that took `ms`; a device-to-device copy moves each
    byte twice through memory (read + written), a host-to-device copy once over the link."""
    return (2 if read_and_write else 1) * nbytes / (ms * 1e-3)


def floor_ms(nbytes: int, rate: float | None) -> float | None:
    """The least time moving `nbytes` at `rate` bytes/s can take."""
    return nbytes / rate * 1e3 if rate else None


def throughput(nbytes: int | None, flops: int | None, ms: float | None) -> tuple[float | None, float | None]:
    """(GB/s, GFLOP/s) achieved when `ms` moved `nbytes` and did `flops`."""
    if not ms or ms <= 0:
        return None, None
    return (nbytes / ms * 1e-6 if nbytes else None), (flops / ms * 1e-6 if flops else None)


def normwise_error(y: np.ndarray, ref: np.ndarray) -> float:
    """max |y - ref| / max |ref|, the measure every check of convsweep uses (NaN propagates)."""
    scale = float(np.max(np.abs(ref))) or 1.0
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(y.astype(np.float64) - ref))) / scale if y.size else 0.0


def conv_check(y: np.ndarray, ref: np.ndarray, tolerance: float, all_written: bool = True) -> tuple[str, str | None, float]:
    """(status, error, max relative error) of a checked subset `y` of a conv output against float64 `ref`."""
    if y.shape != ref.shape:
        return "incorrect", f"output shape {y.shape}, expected {ref.shape}", float("nan")
    err = normwise_error(y, ref)
    if not all_written:
        return "incorrect", "output holds NaN or Inf (unwritten or overflowed elements)", err
    if not math.isfinite(err):
        return "incorrect", "checked images hold NaN or Inf (unwritten or overflowed elements)", err
    if err > tolerance:
        return "incorrect", f"max relative error {err:.3g} exceeds the {tolerance:g} tolerance", err
    return "ok", None, err


def check_indices(batch: int, n: int) -> np.ndarray:
    """The first and the last n images of a batch (each once): both ends of the index range."""
    return np.unique(np.concatenate([np.arange(min(n, batch)), np.arange(max(batch - n, 0), batch)]))


def loosest_precision(precisions) -> str:
    return max(precisions, key=_PRECISION_ORDER.index)


def pick_best(records: list[dict]) -> dict | None:
    """The correct record with the lowest median (the first on a tie); None when none is correct."""
    ok = [r for r in records if r.get("status") == "ok" and median(r.get("samples_ms")) is not None]
    return min(ok, key=lambda r: median(r["samples_ms"])) if ok else None


def network_traffic(network, batch: int, fuses: dict[str, tuple]) -> dict:
    """Bytes and FLOPs of one pass as the runner executes it, conv layers fusing `fuses[name]`.

    `plan_bytes`: each launched step reads its inputs (and weights) and writes its output once;
    a separate ReLU reads and writes its tensor in place. `network_bytes`: the input, every weight
    and the logits once, the floor of a network fused into one kernel.
    """
    from .runner import conv_shape, plan_steps

    e = np.dtype(network.dtype).itemsize
    size = lambda shape: int(np.prod(shape))
    weights = sum(layer.out_channels * (layer.in_shape[0] * layer.kernel ** 2 + 1) if layer.type == "conv2d" else
                  layer.out_features * (layer.in_shape[0] + 1) if layer.type == "dense" else 0
                  for layer in network.layers)
    plan_bytes = flops = 0
    for layer, fused in plan_steps(network, fuses):
        if layer.type == "conv2d":
            shape = conv_shape(layer, batch, network.dtype, fused)
            plan_bytes += shape.min_bytes
            flops += shape.flops
        elif layer.type == "relu":
            plan_bytes += 2 * e * batch * size(layer.in_shape)
        elif layer.type == "maxpool2d":
            plan_bytes += e * batch * (size(layer.in_shape) + size(layer.out_shape))
        elif layer.type == "dense":  # with the relu after it, if any
            n_in, n_out = layer.in_shape[0], layer.out_features
            plan_bytes += e * (batch * n_in + n_out * n_in + n_out + batch * n_out)
            flops += 2 * batch * n_in * n_out
    io = batch * (size(network.input_shape) + size(network.layers[-1].out_shape))
    return {"plan_bytes": plan_bytes, "network_bytes": e * (io + weights), "flops": flops,
            "host_bytes": e * io}


def target_for(targets: dict, key: str, precision: str | None = None) -> float | None:
    value = targets.get("ms", {}).get(key)
    return value.get(precision) if isinstance(value, dict) else value


def _finite(value):
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -- shaping the result --------------------------------------------------------------------------
def build_result(meas: dict, targets: dict) -> dict:
    """Rows with derived numbers (GB/s, GFLOP/s, floor, ratios, verdicts) from raw measurements.

    `meas` holds only what was measured (samples, bytes, flops, statuses); every derived number
    is computed here, so a test can feed it fake numbers.
    """
    c = meas["ceilings"]
    copy_ms, h2d_ms = median(c.get("copy_samples_ms")), median(c.get("h2d_samples_ms"))
    dtod = copy_rate(c["copy_bytes"], copy_ms) if copy_ms else None
    h2d = copy_rate(c["h2d_bytes"], h2d_ms, read_and_write=False) if h2d_ms else None
    ceilings = {**c, "copy_median_ms": copy_ms, "dtod_GBps": dtod * 1e-9 if dtod else None,
                "h2d_median_ms": h2d_ms, "h2d_GBps": h2d * 1e-9 if h2d else None}
    batch = meas["batch"]
    judged = targets.get("batch") == batch
    device_note = None
    if targets.get("device") and targets["device"].lower() not in (meas.get("device") or "").lower():
        device_note = f"targets are for the {targets['device']}; this ran on {meas.get('device')}"
    cudnn = meas.get("cudnn") or {"available": False, "note": "n/a (not measured)"}

    def derived(row: dict, nbytes, flops, floor, target, cudnn_samples=None):
        med = median(row.get("samples_ms"))
        gbps, gflops = throughput(nbytes, flops, med)
        row.update(median_ms=_finite(med), min_ms=_finite(min(row["samples_ms"])) if row.get("samples_ms") else None,
                   GBps=_finite(gbps), GFLOPps=_finite(gflops), floor_ms=_finite(floor),
                   x_floor=_finite(med / floor) if med and floor else None, target_ms=target,
                   met=None if not (judged and target) or row.get("status") == "skipped"
                   else (row.get("status") == "ok" and med is not None and med <= target))
        if cudnn_samples is not None:
            cd = {mode: _finite(median(cudnn_samples.get(mode, {}).get("samples_ms"))) for mode in CUDNN_MODES}
            row["cudnn_ms"] = cd
            mode = row.get("precision")
            row["cudnn_mode"] = mode
            row["ours_over_cudnn"] = _finite(med / cd[mode]) if med and cd.get(mode) else None
        return row

    rows = []
    best = {}
    layers = list(dict.fromkeys(r["layer"] for r in meas.get("convs", [])))
    for layer in layers:
        recs = [r for r in meas["convs"] if r["layer"] == layer]
        chosen = pick_best(recs)
        best[layer] = chosen
        for rec in recs:
            row = {"kind": "conv", "label": layer, **{k: v for k, v in rec.items()}, "best": rec is chosen}
            row["max_rel_err"] = _finite(row.get("max_rel_err"))
            derived(row, rec.get("bytes"), rec.get("flops"), floor_ms(rec["bytes"], dtod) if rec.get("bytes") else None,
                    target_for(targets, layer, rec.get("precision")),
                    cudnn.get("layers", {}).get(layer, {}) if cudnn.get("available") else {})
            rows.append(row)

    for kind, key in (("forward", "forward"), ("end_to_end", "end_to_end")):
        rec = meas.get(kind)
        if rec is None:
            continue
        row = {"kind": kind, "label": key, **rec}
        row["max_rel_err"] = _finite(row.get("max_rel_err"))
        if kind == "forward":
            floor = floor_ms(rec["plan_bytes"], dtod) if rec.get("plan_bytes") else None
            row["network_floor_ms"] = _finite(floor_ms(rec["network_bytes"], dtod)) if rec.get("network_bytes") else None
            derived(row, rec.get("plan_bytes"), rec.get("flops"), floor, target_for(targets, key, rec.get("precision")),
                    cudnn.get("forward", {}) if cudnn.get("available") else {})
        else:
            floor = floor_ms(rec["host_bytes"], h2d) if rec.get("host_bytes") else None
            derived(row, rec.get("host_bytes"), rec.get("flops"), floor, target_for(targets, key, rec.get("precision")))
        rows.append(row)

    for profiler, run in (meas.get("harness") or {}).items():
        key = f"harness_{profiler}"
        cached = run.get("runs", [])[-1] if run.get("runs") else None
        row = {"kind": "harness", "label": key, "profiler": profiler, "variant": run.get("variant"),
               "status": cached.get("status") if cached else run.get("status", "skipped"),
               "error": cached.get("error") if cached else run.get("note"),
               "samples_ms": [cached["total_s"] * 1e3] if cached and cached.get("total_s") is not None else [],
               "runs": run.get("runs", []), "job_id": run.get("job_id")}
        derived(row, None, None, None, target_for(targets, key))
        rows.append(row)

    return {"format": FORMAT, "config": meas.get("config"), "device": meas.get("device"), "batch": batch,
            "repeats": meas.get("repeats"), "warmup": meas.get("warmup"), "seed": meas.get("seed"),
            "environment": meas.get("environment"), "ceilings": ceilings,
            "best": {layer: ({"variant": b["variant"], "params": b["resolved_params"], "median_ms": _finite(median(b["samples_ms"]))}
                             if b else None) for layer, b in best.items()},
            "cudnn": {k: v for k, v in cudnn.items()}, "targets": {**targets, "judged": judged, "device_note": device_note},
            "rows": rows}


def _ms(v, digits: int = 3) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _params_text(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


def table_rows(result: dict) -> list[list[str]]:
    """The printed table, best row of each conv layer first, then its other candidates."""
    cudnn = result.get("cudnn") or {}
    na = cudnn.get("note") or "n/a"
    out = []

    def line(label: str, row: dict) -> list[str]:
        variant = row.get("variant") or ""
        if row.get("params"):
            variant += f" {_params_text(row['params'])}"
        if row["kind"] in ("conv", "forward"):
            if cudnn.get("available"):
                cd = row.get("cudnn_ms") or {}
                cells = [_ms(cd.get(m)) or "failed" for m in CUDNN_MODES]
                ratio = f"{row['ours_over_cudnn']:.2f} ({row['cudnn_mode']})" if row.get("ours_over_cudnn") else ""
            else:
                cells, ratio = [na, "n/a", "n/a"], "n/a"
        else:
            cells, ratio = ["", "", ""], ""
        status = row.get("status") or ""
        if row.get("error"):
            status += f": {row['error']}"[:60]
        met = "" if row.get("target_ms") is None else ("n/a" if row.get("met") is None else ("yes" if row["met"] else "no"))
        return [label, variant, status, _ms(row.get("median_ms")), _ms(row.get("min_ms")), _ms(row.get("GBps"), 0),
                _ms(row.get("GFLOPps"), 0), _ms(row.get("floor_ms")), _ms(row.get("x_floor"), 2), *cells, ratio,
                _ms(row.get("target_ms"), 2), met]

    rows = result["rows"]
    for layer in dict.fromkeys(r["label"] for r in rows if r["kind"] == "conv"):
        recs = [r for r in rows if r["kind"] == "conv" and r["label"] == layer]
        best = [r for r in recs if r.get("best")]
        if best:
            out.append(line(f"{layer} best", best[0]))
        else:
            out.append([f"{layer} best", "", "no correct candidate"] + [""] * (len(TABLE_HEADERS) - 3))
        out += [line(layer, r) for r in recs if not r.get("best")]
    for r in rows:
        if r["kind"] == "forward":
            out.append(line("forward (on device)", r))
        elif r["kind"] == "end_to_end":
            out.append(line(f"end to end ({r.get('streams')} streams)", r))
        elif r["kind"] == "harness":
            out.append(line(f"harness {r['profiler']} (cached job)", r))
    return out


TABLE_HEADERS = ["row", "variant", "status", "ms", "min ms", "GB/s", "GFLOP/s", "floor ms", "×floor", "cuDNN fp32",
                 "cuDNN tf32", "cuDNN fp16", "ours/cuDNN", "target ms", "met?"]


def format_report(result: dict) -> str:
    from tabulate import tabulate

    c = result["ceilings"]
    head = [f"convsweep bench: {result.get('device')}, batch {result['batch']}, {result.get('repeats')} repeats "
            f"(median of events, after {result.get('warmup')} warm-up passes)",
            f"memory floor rate: device copy {_ms(c.get('dtod_GBps'), 0)} GB/s (read + write); "
            f"pinned H2D {_ms(c.get('h2d_GBps'), 1)} GB/s"]
    matmul = c.get("matmul_TFLOPps")
    if matmul:
        head.append("matmul ceilings (PyTorch): " + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in matmul.items() if v))
    table = tabulate(table_rows(result), headers=TABLE_HEADERS, tablefmt="github", disable_numparse=True)
    notes = ["floor: the row's least bytes (inputs, weights, output once each) at the device copy rate; "
             "forward: every launched layer's traffic (the whole network fused into one kernel: "
             + (_ms(next((r.get("network_floor_ms") for r in result["rows"] if r["kind"] == "forward"), None)) or "?")
             + " ms); end to end: input and logits at the pinned H2D rate",
             "ours/cuDNN: against the cuDNN mode of the variant's precision class (fp32, tf32, fp16)"]
    if matmul and matmul.get("fp32"):
        for r in result["rows"]:
            if r["kind"] == "conv" and r.get("best") and r.get("flops"):
                notes.append(f"{r['label']}: {r['flops'] / 1e9:.1f} GFLOP = {r['flops'] / (matmul['fp32'] * 1e12) * 1e3:.3f} ms "
                             f"at the fp32 matmul rate" + (f", {r['flops'] / (matmul['fp16'] * 1e12) * 1e3:.3f} ms at fp16"
                                                          if matmul.get("fp16") else ""))
    t = result["targets"]
    if not t.get("judged"):
        notes.append(f"targets are for batch {t.get('batch')}: not judged at batch {result['batch']}")
    if t.get("device_note"):
        notes.append(t["device_note"])
    if not (result.get("cudnn") or {}).get("available"):
        notes.append(f"cuDNN: {(result.get('cudnn') or {}).get('note')}")
    return "\n".join(head) + "\n\n" + table + "\n\n" + "\n".join(f"- {n}" for n in notes)


# -- measuring on the GPU ------------------------------------------------------------------------
def _event_samples(gpu, stream, run: Callable[[], None], warmup: int, repeats: int) -> list[float]:
    """Warm up, then `repeats` runs each between two events on `stream`; ms per run."""
    for _ in range(warmup):
        run()
    pairs = []
    for _ in range(repeats):
        start = gpu.event(stream)
        run()
        pairs.append((start, gpu.event(stream)))
    pairs[-1][1].sync()
    return [end - start for start, end in pairs]


def measure_ceilings(gpu, stream, copy_bytes: int, warmup: int, repeats: int) -> dict:
    """Device-to-device copy (the memory floor's rate) and pinned host-to-device copy, timed with events."""
    from .gpu import DeviceArray

    src = gpu.alloc((copy_bytes,), np.uint8)
    dst = gpu.alloc((copy_bytes,), np.uint8)
    gpu.fill(src, 0x3F, stream)
    copy = _event_samples(gpu, stream, lambda: gpu.copy(dst, src, stream), max(warmup, 1), repeats)
    h2d_bytes = min(copy_bytes, 256 << 20)
    host = gpu.host_array((h2d_bytes,), np.uint8, "pinned")
    host[...] = 1
    head = DeviceArray(dst.ptr, (h2d_bytes,), np.dtype(np.uint8))
    h2d = _event_samples(gpu, stream, lambda: gpu.upload(host, head, stream), max(warmup, 1), repeats)
    return {"copy_bytes": copy_bytes, "copy_samples_ms": copy, "h2d_bytes": h2d_bytes, "h2d_samples_ms": h2d}


@dataclass
class LayerInputs:
    """One conv layer's random problem, on the host and on the device; shared by its candidates."""

    x: np.ndarray
    w: np.ndarray
    b: np.ndarray
    x_dev: Any
    w_dev: Any
    b_dev: Any
    y_dev: Any  # room for the unfused output; fused variants write a smaller prefix
    check_idx: np.ndarray
    ref: np.ndarray  # float64 conv of the checked images (unfused)


def _layer_inputs(gpu, stream, layer, batch: int, seed: int, layer_index: int, check_images: int) -> LayerInputs:
    from .network import conv2d_reference

    c, h, w_ = layer.in_shape
    m, k = layer.out_channels, layer.kernel
    rng = np.random.default_rng([seed, layer_index])
    x = rng.standard_normal((batch, c, h, w_), dtype=np.float32)
    w = rng.standard_normal((m, c, k, k), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    idx = check_indices(batch, check_images)
    ref = conv2d_reference(x[idx].astype(np.float64), w.astype(np.float64), b.astype(np.float64), layer.stride)
    x_dev, w_dev, b_dev = (gpu.to_device(a, stream) for a in (x, w, b))
    y_dev = gpu.alloc((batch, *layer.out_shape), np.float32)
    return LayerInputs(x, w, b, x_dev, w_dev, b_dev, y_dev, idx, ref)


def _fused_reference(ref: np.ndarray, shape) -> np.ndarray:
    from .network import maxpool2d_reference

    return maxpool2d_reference(np.maximum(ref, 0.0), shape.P, shape.PS) if shape.P else ref


def measure_candidate(gpu, stream, network, layer, cand: Candidate, inputs: LayerInputs, batch: int, warmup: int,
                      repeats: int) -> dict:
    """Check one candidate against float64, then time it; a failure is a record, not an exception."""
    from .gpu import DeviceArray
    from .job import failure_message
    from .runner import ConvOp, conv_shape
    from .variants import get_variant

    var = get_variant(cand.variant)
    rec = {"layer": layer.name, "variant": cand.variant, "params": cand.params, "resolved_params": cand.resolved,
           "precision": var.precision, "tolerance": var.tolerance, "fused": list(var.fuses), "status": "failed",
           "error": None, "max_rel_err": None, "max_rel_err_after": None, "samples_ms": []}
    try:
        fused = network.fused_layers(layer.name, var.fuses) if var.fuses else ()
        shape = conv_shape(layer, batch, network.dtype, fused)
        rec.update(shape=dataclasses.asdict(shape), bytes=shape.min_bytes, flops=shape.flops)
        if gpu.compute_capability < var.min_cc:
            raise ConvsweepError(f"variant '{var.name}' needs compute capability {var.min_cc}, {gpu.name} has "
                                 f"{gpu.compute_capability}")
        var.check_shape(shape, cand.resolved)
        op = ConvOp(gpu, var, cand.resolved, shape)
        rec["build"] = op.build.record()
        op.bind_weights(inputs.w_dev, stream)
        y = DeviceArray(inputs.y_dev.ptr, shape.out_shape, np.dtype(np.float32))  # fused outputs are smaller
        workspace = op.workspace(shape)

        def run():
            op.enqueue(stream, y, inputs.x_dev, inputs.w_dev, inputs.b_dev, shape, workspace)

        ref = _fused_reference(inputs.ref, shape)
        gpu.fill(y, 0xFF, stream)  # NaN: an element the kernel never writes fails the check
        run()
        y_host = np.empty(y.shape, np.float32)
        gpu.download(y, y_host, stream)
        stream.sync()
        status, error, err = conv_check(y_host[inputs.check_idx], ref, var.tolerance, bool(np.isfinite(y_host).all()))
        del y_host
        rec.update(status=status, error=error, max_rel_err=_finite(err))

        rec["samples_ms"] = _event_samples(gpu, stream, run, warmup, repeats)

        after = np.empty((len(inputs.check_idx), *y.shape[1:]), np.float32)
        for i, image in enumerate(inputs.check_idx):  # the last run's output: the same images again
            gpu.download(y.rows(int(image), int(image) + 1), after[i : i + 1], stream)
        stream.sync()
        status2, error2, err2 = conv_check(after, ref, var.tolerance)
        rec["max_rel_err_after"] = _finite(err2)
        if status == "ok" and status2 != "ok":
            rec.update(status=status2, error=f"after timing: {error2} (a moving error is a race)")
    except Exception as e:
        rec.update(status="failed", error=failure_message(e))
    return rec


def _best_variants(convs: list[dict]) -> dict[str, dict] | None:
    best = {}
    for layer in dict.fromkeys(r["layer"] for r in convs):
        chosen = pick_best([r for r in convs if r["layer"] == layer])
        if chosen is None:
            return None
        best[layer] = chosen
    return best


def _network_inputs(config: BenchConfig, batch: int):
    """Real images, the network's weights and the float64 reference logits, as jobs load them."""
    from .job import load_batch, reference_logits

    network = config.network
    dataset, weights, idx = load_batch(network, config.dataset, batch)
    ref = reference_logits(network, dataset, weights)[idx]
    images = np.ascontiguousarray(dataset.images[idx], dtype=network.dtype)
    return dataset, weights, idx, images, ref


def _plan_for(config: BenchConfig, best: dict[str, dict]):
    from .variants import get_variant

    variants = {layer.name: get_variant(best[layer.name]["variant"]) for layer in config.network.conv_layers}
    params = {name: best[name]["resolved_params"] for name in variants}
    precision = loosest_precision(v.precision for v in variants.values())
    return variants, params, precision


def measure_forward(gpu, config: BenchConfig, best, inputs, batch: int, warmup: int, repeats: int) -> dict:
    """The whole network with the best variants, images already on the device, one lane and stream."""
    from .job import check_logits, failure_message
    from .runner import GpuNetwork

    dataset, weights, idx, images, ref = inputs
    network = config.network
    variants, params, precision = _plan_for(config, best)
    traffic = network_traffic(network, batch, {name: v.fuses for name, v in variants.items()})
    rec = {"variant": "+".join(f"{n}:{v.name}" for n, v in variants.items()), "variants": {n: v.name for n, v in variants.items()},
           "params_by_layer": params, "precision": precision, "status": "failed", "error": None, "samples_ms": [], **traffic}
    try:
        stream = gpu.stream()
        net = GpuNetwork(gpu, network, weights, variants, params, 1, batch, stream)
        x_dev = gpu.to_device(images, stream)
        logits_dev = gpu.alloc((batch, *network.layers[-1].out_shape), network.dtype)
        gpu.fill(logits_dev, 0xFF, stream)
        rec["samples_ms"] = _event_samples(gpu, stream, lambda: net.enqueue(stream, net.lanes[0], x_dev, logits_dev, batch),
                                           warmup, repeats)
        logits = np.empty(logits_dev.shape, logits_dev.dtype)
        gpu.download(logits_dev, logits, stream)
        stream.sync()
        status, error, err, accuracy, agreement = check_logits(logits, ref, dataset.labels, idx, variants)
        rec.update(status=status, error=error, max_rel_err=_finite(err), accuracy=accuracy, prediction_agreement=agreement)
    except Exception as e:
        rec.update(status="failed", error=failure_message(e))
    return rec


def measure_end_to_end(gpu, config: BenchConfig, best, inputs, batch: int, warmup: int, repeats: int) -> dict:
    """Host images -> host logits on S streams, chunked as jobs chunk; events around the whole pass."""
    from .job import _chunks, check_logits, failure_message
    from .runner import GpuNetwork, pipeline_buffers, pipeline_pass

    dataset, weights, idx, images, ref = inputs
    network = config.network
    e2e = config.end_to_end
    variants, params, precision = _plan_for(config, best)
    traffic = network_traffic(network, batch, {name: v.fuses for name, v in variants.items()})
    chunks = _chunks(batch, e2e["streams"], e2e["chunk_images"])
    rec = {"variant": "+".join(f"{n}:{v.name}" for n, v in variants.items()), "variants": {n: v.name for n, v in variants.items()},
           "params_by_layer": params, "precision": precision, "streams": e2e["streams"], "host_memory": e2e["host_memory"],
           "chunks": len(chunks), "chunk_images": max(hi - lo for lo, hi in chunks), "status": "failed", "error": None,
           "samples_ms": [], **traffic}
    try:
        streams = [gpu.stream() for _ in range(e2e["streams"])]
        net = GpuNetwork(gpu, network, weights, variants, params, len(streams), rec["chunk_images"], streams[0])
        x_host, x_dev, logits_host, logits_dev = pipeline_buffers(gpu, network, images, e2e["host_memory"], streams[0])

        def one_pass() -> float:
            start, _, _, end = pipeline_pass(gpu, net, streams, chunks, x_host, x_dev, logits_host, logits_dev)
            end.sync()  # the logits are on the host only now; the next pass reuses the buffers
            return end - start

        for _ in range(warmup):
            one_pass()
        rec["samples_ms"] = [one_pass() for _ in range(repeats)]
        status, error, err, accuracy, agreement = check_logits(np.array(logits_host), ref, dataset.labels, idx, variants)
        rec.update(status=status, error=error, max_rel_err=_finite(err), accuracy=accuracy, prediction_agreement=agreement)
    except Exception as e:
        rec.update(status="failed", error=failure_message(e))
    return rec


# -- cuDNN through PyTorch (optional) ------------------------------------------------------------
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
def _torch_mode(torch, mode: str, benchmark: bool):
    """fp32: TF32 off; tf32: TF32 on (convolutions and matmuls); fp16: TF32 off (inputs are half)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark)
    cudnn.allow_tf32 = matmul.allow_tf32 = mode == "tf32"
    cudnn.benchmark = benchmark
    try:
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark = saved


def _torch_samples(torch, stream, fn, warmup: int, repeats: int) -> list[float]:
    """Like _event_samples, with torch.cuda.Event on a torch stream."""
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
        pairs = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
            pairs.append((start, end))
    stream.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def _torch_inputs(torch, mode: str, tensors: list):
    """The tensors as `mode` runs them: fp16 in half, 4-d ones channels_last."""
    if mode != "fp16":
        return tensors
    out = []
    for t in tensors:
        t = t.half()
        out.append(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
    return out


def torch_network(torch, network, weights: dict, x) -> Callable[[], Any]:
    """The network as PyTorch calls on tensors `weights` (by key) and input `x`: a no-argument forward."""
    F = torch.nn.functional
    for layer in network.layers:
        if layer.type not in ("conv2d", "relu", "maxpool2d", "flatten", "dense"):
            raise ConvsweepError(f"{network.path}: layer type {layer.type!r} has no PyTorch form in the bench")

    def forward():
        h = x
        for layer in network.layers:
            if layer.type == "conv2d":
                h = F.conv2d(h, weights[f"{layer.name}.weight"], weights[f"{layer.name}.bias"], stride=layer.stride)
            elif layer.type == "relu":
                h = F.relu(h)
            elif layer.type == "maxpool2d":
                h = F.max_pool2d(h, layer.size, layer.stride)
            elif layer.type == "flatten":
                h = torch.flatten(h, 1)
            else:
                h = F.linear(h, weights[f"{layer.name}.weight"], weights[f"{layer.name}.bias"])
        return h

    return forward


def measure_cudnn(torch, config: BenchConfig, layer_inputs: dict, network_inputs, batch: int, warmup: int,
                  repeats: int) -> dict:
    """cuDNN on the same conv problems and the whole network, every mode, on a stream of its own."""
    from .job import failure_message

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
                with _torch_mode(torch, mode, config.cudnn_benchmark):
                    x, w, b = _torch_inputs(torch, mode, base)
                    torch.cuda.synchronize()
                    fn = lambda: F.conv2d(x, w, b, stride=layer.stride)
                    samples = _torch_samples(torch, stream, fn, warmup, repeats)
                    with torch.cuda.stream(stream):
                        y = fn()[torch.from_numpy(li.check_idx).cuda()].float().cpu().numpy()
                out["layers"].setdefault(layer.name, {})[mode] = {"samples_ms": samples,
                                                                  "max_rel_err": _finite(normwise_error(y, li.ref))}
            except Exception as e:
                out["layers"].setdefault(layer.name, {})[mode] = {"samples_ms": [], "error": failure_message(e)}
            torch.cuda.synchronize()
        del base
        torch.cuda.empty_cache()

    dataset, weights, idx, images, ref = network_inputs
    net = config.network
    base_w = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).cuda() for k, v in weights.items()}
    base_x = torch.from_numpy(images).cuda()
    for mode in CUDNN_MODES:
        try:
            with _torch_mode(torch, mode, config.cudnn_benchmark):
                keys = list(base_w)
                cast = dict(zip(keys, _torch_inputs(torch, mode, [base_w[k] for k in keys])))
                (x,) = _torch_inputs(torch, mode, [base_x])
                torch.cuda.synchronize()

                forward = torch_network(torch, net, cast, x)
                samples = _torch_samples(torch, stream, forward, warmup, repeats)
                with torch.cuda.stream(stream):
                    logits = forward().float().cpu().numpy()
            out["forward"][mode] = {"samples_ms": samples, "max_rel_err": _finite(normwise_error(logits, ref))}
        except Exception as e:
            out["forward"][mode] = {"samples_ms": [], "error": failure_message(e)}
        torch.cuda.synchronize()
    del base_w, base_x
    torch.cuda.empty_cache()
    return out


def _matmul_rate(torch, stream, mode: str, n: int, warmup: int, repeats: int) -> float:
    dtype = torch.float16 if mode == "fp16" else torch.float32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    with _torch_mode(torch, mode, True):
        samples = _torch_samples(torch, stream, lambda: a @ b, max(warmup, 1), min(repeats, 10))
    return 2 * n ** 3 / (median(samples) * 1e-3) / 1e12


def measure_matmul(torch, warmup: int, repeats: int, n: int = 8192) -> dict:
    """TFLOP/s of an n x n x n matmul per mode: the compute ceilings beside the copy's memory ceiling."""
    stream = torch.cuda.Stream()
    rates = {}
    for mode in CUDNN_MODES:
        try:
            rates[mode] = _matmul_rate(torch, stream, mode, n, warmup, repeats)
        except Exception:
            rates[mode] = None
        torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rates


# -- the harness: real jobs through the CLI ------------------------------------------------------
def run_harness(config: BenchConfig, best: dict[str, dict] | None, batch: int, profilers=("events", "nsys"),
                runs: int = 2, log: Callable[[str], None] = lambda m: None) -> dict:
    """`convsweep run-job` `runs` times per profiler (the same job: the later runs hit the compile
    cache), each a fresh process as Snakemake starts it; total_s is the job's own wall time from
    process start, wall_s the parent's clock around the process."""
    from .config import JobSpec
    from .nsys import find_nsys

    out = {}
    if best is None:
        return {p: {"status": "skipped", "note": "no correct candidate for every conv layer"} for p in profilers}
    net = config.network_path
    try:
        network = str(net.relative_to(ROOT))
    except ValueError:
        network = str(net)
    with tempfile.TemporaryDirectory(prefix="convsweep-harness-") as tmp:
        for profiler in profilers:
            if profiler == "nsys" and find_nsys() is None:
                out[profiler] = {"status": "skipped", "note": "nsys not found (PATH or $NSYS)"}
                continue
            spec = JobSpec(experiment="bench-harness", network=network, dataset=config.dataset,
                           variants={layer: best[layer]["variant"] for layer in best},
                           params={layer: best[layer]["resolved_params"] for layer in best}, batch=batch,
                           streams=config.end_to_end["streams"], host_memory=config.end_to_end["host_memory"],
                           repeats=config.harness["repeats"], warmup=config.harness["warmup"], profiler=profiler,
                           chunk_images=config.end_to_end["chunk_images"],
                           sweep={"experiment": "bench-harness", "config_path": str(config.path)})
            text = json.dumps({**spec.to_dict(), "sweep": spec.sweep})
            records = []
            for i in range(runs):
                path = Path(tmp) / f"{profiler}-{i}.json"
                log(f"harness: {profiler} job, run {i + 1}/{runs}")
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "convsweep.cli", "run-job", "--spec", text, "--out", str(path)],
                                      capture_output=True, text=True, cwd=ROOT)
                wall = time.perf_counter() - t
                result = json.loads(path.read_text()) if path.is_file() else {}
                builds = result.get("builds") or []
                records.append({"run": i, "wall_s": wall, "returncode": proc.returncode,
                                "status": result.get("status", "failed"),
                                "error": result.get("error") or (None if result else (proc.stderr.strip().splitlines() or ["no result"])[-1]),
                                "total_s": (result.get("timings") or {}).get("total_s"), "profiler": result.get("profiler"),
                                "phases_s": result.get("phases_s"), "compile_ms": (result.get("timings") or {}).get("compile_ms"),
                                "cache_hits": [b.get("cache_hit") for b in builds],
                                "forward_ms": (result.get("timings") or {}).get("forward_ms")})
            cached = records[-1]
            if cached["status"] == "ok" and not all(cached["cache_hits"] or [False]):
                cached["error"] = "the repeated job did not hit the compile cache"
            out[profiler] = {"job_id": spec.job_id, "variant": "+".join(f"{k}:{v}" for k, v in spec.variants.items()),
                             "runs": records}
    return out


# -- the whole bench -----------------------------------------------------------------------------
def run_bench(config: BenchConfig, batch: int | None = None, repeats: int | None = None, harness: bool = False,
              harness_profilers=("events", "nsys"), log: Callable[[str], None] = lambda m: None) -> dict:
    """Measure everything (see the module docstring) and return build_result's dict."""
    from .gpu import Gpu
    from .job import environment
    from .nsys import find_nsys

    batch = batch or config.batch
    repeats = repeats or config.repeats
    warmup = config.warmup
    network = config.network
    meas = {"config": str(config.path), "batch": batch, "repeats": repeats, "warmup": warmup, "seed": config.seed}
    torch, torch_note = torch_cuda()  # imported before any timing, so the import is never inside a phase
    with Gpu() as gpu:
        meas["device"] = gpu.name
        meas["environment"] = environment(gpu, find_nsys())
        stream = gpu.stream()
        log(f"ceilings: {config.copy_mib} MiB device copy, pinned H2D")
        meas["ceilings"] = measure_ceilings(gpu, stream, config.copy_mib << 20, warmup, repeats)
        meas["convs"] = []
        layer_inputs = {}
        for i, layer in enumerate(network.conv_layers):
            if layer.name not in config.candidates:
                continue
            inputs = layer_inputs[layer.name] = _layer_inputs(gpu, stream, layer, batch, config.seed, i, config.check_images)
            for cand in config.candidates[layer.name]:
                log(f"{layer.name}: {cand.variant} {_params_text(cand.params)}")
                rec = measure_candidate(gpu, stream, network, layer, cand, inputs, batch, warmup, repeats)
                log(f"  {rec['status']}" + (f" {median(rec['samples_ms']):.4f} ms" if rec["samples_ms"] else "")
                    + (f" - {rec['error']}" if rec["error"] else ""))
                meas["convs"].append(rec)
        missing = [layer.name for layer in network.conv_layers if layer.name not in config.candidates]
        best = None if missing else _best_variants(meas["convs"])
        net_inputs = _network_inputs(config, batch)
        if best is None:
            why = (f"the bench file has no candidates for {', '.join(missing)}" if missing
                   else "a conv layer has no correct candidate")
            meas["forward"] = {"status": "skipped", "error": why, "samples_ms": []}
            meas["end_to_end"] = {"status": "skipped", "error": why, "samples_ms": [], "streams": config.end_to_end["streams"]}
        else:
            log("forward on the device")
            meas["forward"] = measure_forward(gpu, config, best, net_inputs, batch, warmup, repeats)
            log(f"end to end, {config.end_to_end['streams']} streams")
            meas["end_to_end"] = measure_end_to_end(gpu, config, best, net_inputs, batch, warmup, repeats)
        gpu.device.sync()
        if torch is None:
            meas["cudnn"] = {"available": False, "note": torch_note}
        else:
            log("cuDNN (PyTorch)")
            try:
                meas["cudnn"] = measure_cudnn(torch, config, layer_inputs, net_inputs, batch, warmup, repeats)
                meas["ceilings"]["matmul_TFLOPps"] = measure_matmul(torch, warmup, repeats)
            except Exception as e:
                from .job import failure_message

                meas["cudnn"] = {"available": False, "note": f"n/a (PyTorch failed: {failure_message(e)})"}
            torch.cuda.synchronize()
    if harness:
        meas["harness"] = run_harness(config, best, batch, harness_profilers, log=log)
    return build_result(meas, config.targets)
