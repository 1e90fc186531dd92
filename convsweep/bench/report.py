"""The bench's numbers, derived: medians and their spread, memory floors, throughput, ratios to
cuDNN, verdicts against the targets, and the printed table. Pure functions of what was measured,
so the tests feed them fake numbers.
"""
from __future__ import annotations

import math
from typing import cast

import numpy as np
from tabulate import tabulate

from convsweep.device.floors import UNITS, Ceiling, Work, forward_floor_ms, work_floor_ms
from convsweep.measure.files import BenchCeilings, BenchFile
from convsweep.model.network import Network, weight_shapes
from convsweep.base.numbers import finite, median
from convsweep.base.stats import MIN_SAMPLES, bootstrap_ratio, relative_spread

CUDNN_MODES = ("fp32", "tf32", "fp16")  # cuDNN columns; a variant is compared with the mode of its precision class
INSTEAD_MODES = ("fp32", "fp16")  # PyTorch's whole forward, the ways a user would run it instead of ours


def ceiling_of(ceilings: BenchCeilings, device: str | None) -> Ceiling | None:
    """The measured rates a bench result's `ceilings` hold, as convsweep.device.floors takes them (None
    without the device copy rate)."""
    if not ceilings.dtod_GBps:
        return None
    matmul = ceilings.matmul_TFLOPps or {}
    return Ceiling(device, ceilings.dtod_GBps * 1e9, (ceilings.h2d_GBps or 0) * 1e9 or None,
                   (ceilings.d2h_GBps or 0) * 1e9 or None,
                   {unit: rate * 1e12 for unit in UNITS if (rate := matmul.get(unit))})


def copy_rate(nbytes: int, ms: float, read_and_write: bool = True) -> float:
    """Bytes per second of a copy of `nbytes` that took `ms`; a device-to-device copy moves each
    byte twice through memory (read + written), a host-to-device copy once over the link."""
    return (2 if read_and_write else 1) * nbytes / (ms * 1e-3)


def throughput(nbytes: int | None, flops: int | None, ms: float | None) -> tuple[float | None, float | None]:
    """(GB/s, GFLOP/s) achieved when `ms` moved `nbytes` and did `flops`."""
    if not ms or ms <= 0:
        return None, None
    return (nbytes / ms * 1e-6 if nbytes else None), (flops / ms * 1e-6 if flops else None)


def pick_best(records: list[dict]) -> dict | None:
    """The correct record with the lowest median (the first on a tie); None when none is correct."""
    ok = [r for r in records if r.get("status") == "ok" and median(r.get("samples_ms")) is not None]
    return min(ok, key=lambda r: cast(float, median(r["samples_ms"]))) if ok else None


def tied_with(best: dict | None, record: dict) -> bool:
    """Whether a correct record cannot be told from the best one: the bootstrap interval of its
    median over the best's reaches down to 1 (with at least MIN_SAMPLES samples each)."""
    if best is None or record is best or record.get("status") != "ok":
        return False
    a, b = best.get("samples_ms") or [], record.get("samples_ms") or []
    return len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES and bootstrap_ratio(a, b)[1] <= 1.0


def network_traffic(network: Network, batch: int, fuses: dict[str, tuple], absorbs: dict[str, tuple] | None = None) -> dict:
    """Bytes and FLOPs of one pass as the runner executes it, conv layers fusing `fuses[name]` (and
    absorbing the network's first layer where `absorbs[name]` says they do).

    `plan_bytes`: each launched step reads its inputs (and weights) and writes its output once
    (each layer kind says what that is); `network_bytes`: the input, every weight and the logits
    once, the floor of a network fused into one kernel; `shipped_bytes` and `logits_bytes`: what
    crosses the bus each way (the input in its format), `host_bytes` both.
    """
    e = np.dtype(network.dtype).itemsize
    weights = sum(math.prod(shape) for shape in weight_shapes(network).values())
    plan_bytes = flops = 0
    for step in network.steps(fuses, absorbs):
        step_bytes, step_flops = step.layer.kind.traffic(network, step, batch, e)
        plan_bytes += step_bytes
        flops += step_flops
    shipped = batch * math.prod(network.input_shape) * np.dtype(network.shipped_dtype).itemsize
    logits = batch * math.prod(network.layers[-1].out_shape) * e
    return {"plan_bytes": plan_bytes, "network_bytes": shipped + logits + e * weights, "flops": flops,
            "shipped_bytes": shipped, "logits_bytes": logits, "host_bytes": shipped + logits}


def target_for(targets: dict, key: str, kind: str | None = None) -> float | None:
    """A row's target: one number, or one per kind of row (a conv layer's per precision class, the end
    to end's per input format)."""
    value = targets.get("ms", {}).get(key)
    return value.get(kind) if isinstance(value, dict) else value


def _floor(ceiling: Ceiling | None, nbytes: int | None, rec: dict) -> float | None:
    """A row's floor at the measured rates: `nbytes`, and its FLOPs on its unit."""
    if ceiling is None or not nbytes:
        return None
    return work_floor_ms(ceiling, Work(nbytes, rec.get("flops"), rec.get("unit")))


def build_result(meas: dict, targets: dict) -> dict:
    """The bench file (a convsweep.measure.files.BenchFile, as JSON): rows with derived numbers (GB/s, GFLOP/s,
    floor, ratios, verdicts) from raw measurements.

    `meas` holds only what was measured (samples, bytes, flops, statuses); every derived number
    is computed here, so a test can feed it fake numbers.
    """
    c = meas["ceilings"]
    copy_ms, h2d_ms, d2h_ms = (median(c.get(f"{k}_samples_ms")) for k in ("copy", "h2d", "d2h"))
    dtod = copy_rate(c["copy_bytes"], copy_ms) if copy_ms else None
    h2d = copy_rate(c["h2d_bytes"], h2d_ms, read_and_write=False) if h2d_ms else None
    d2h = copy_rate(c["h2d_bytes"], d2h_ms, read_and_write=False) if d2h_ms else None
    ceilings = BenchCeilings(copy_bytes=c["copy_bytes"], copy_samples_ms=c["copy_samples_ms"], h2d_bytes=c["h2d_bytes"],
                             h2d_samples_ms=c["h2d_samples_ms"], d2h_samples_ms=c["d2h_samples_ms"],
                             copy_median_ms=copy_ms, dtod_GBps=dtod * 1e-9 if dtod else None,
                             h2d_median_ms=h2d_ms, h2d_GBps=h2d * 1e-9 if h2d else None,
                             d2h_median_ms=d2h_ms, d2h_GBps=d2h * 1e-9 if d2h else None)
    if "matmul_TFLOPps" in c:  # where PyTorch measured them
        ceilings.matmul_TFLOPps = c["matmul_TFLOPps"]
    ceiling = ceiling_of(ceilings, meas.get("device"))
    batch = meas["batch"]
    judged = targets.get("batch") == batch
    device_note = None
    if targets.get("device") and targets["device"].lower() not in (meas.get("device") or "").lower():
        device_note = f"targets are for the {targets['device']}; this ran on {meas.get('device')}"
    cudnn = meas.get("cudnn") or {"available": False, "note": "n/a (not measured)"}

    def derived(row: dict, nbytes, flops, floor, target, cudnn_samples=None):
        samples = row.get("samples_ms") or []
        med = median(samples)
        gbps, gflops = throughput(nbytes, flops, med)
        # One sample (a harness row's: the cached job's total) has no spread to speak of.
        row.update(median_ms=finite(med), spread=finite(relative_spread(samples)) if len(samples) > 1 else None,
                   min_ms=finite(min(samples)) if samples else None,
                   GBps=finite(gbps), GFLOPps=finite(gflops), floor_ms=finite(floor),
                   x_floor=finite(med / floor) if med and floor else None, target_ms=target,
                   met=None if not (judged and target) or row.get("status") == "skipped"
                   else (row.get("status") == "ok" and med is not None and med <= target))
        if cudnn_samples is not None:
            cd: dict[str | None, float | None] = {
                mode: finite(median(cudnn_samples.get(mode, {}).get("samples_ms"))) for mode in CUDNN_MODES}
            row["cudnn_ms"] = cd
            mode = row.get("precision")
            row["cudnn_mode"] = mode
            row["ours_over_cudnn"] = finite(med / cast(float, cd[mode])) if med and cd.get(mode) else None
        return row

    rows = []
    best = {}
    layers = list(dict.fromkeys(r["layer"] for r in meas.get("convs", [])))
    for layer in layers:
        recs = [r for r in meas["convs"] if r["layer"] == layer]
        chosen = pick_best(recs)
        best[layer] = chosen
        for rec in recs:
            row = {"kind": "conv", "label": layer, **{k: v for k, v in rec.items()}, "best": rec is chosen,
                   "tied": tied_with(chosen, rec)}
            row["max_rel_err"] = finite(row.get("max_rel_err"))
            derived(row, rec.get("bytes"), rec.get("flops"), _floor(ceiling, rec.get("bytes"), rec),
                    target_for(targets, layer, rec.get("precision")),
                    cudnn.get("layers", {}).get(layer, {}) if cudnn.get("available") else {})
            rows.append(row)

    # The fastest correct forward plan first (the one end to end runs), then the other plans.
    # Each row's label is its targets key.
    # An end-to-end row per input format, at the bench's batch and at the small one.
    network_recs = [("forward", "forward", meas.get("forward")),
                    *(("forward", "forward", r) for r in meas.get("other_forwards", [])),
                    *(("end_to_end", "end_to_end", r) for r in meas.get("end_to_end") or []),
                    *(("end_to_end", "end_to_end_small", r) for r in meas.get("end_to_end_small") or [])]
    for kind, key, rec in network_recs:
        if rec is None:
            continue
        row = {"kind": kind, "label": key, **rec}
        row["max_rel_err"] = finite(row.get("max_rel_err"))
        compute = _floor(ceiling, rec.get("plan_bytes"), rec)
        if kind == "forward":
            row["network_floor_ms"] = finite(_floor(ceiling, rec.get("network_bytes"), rec))
            derived(row, rec.get("plan_bytes"), rec.get("flops"), compute, target_for(targets, key, rec.get("precision")),
                    cudnn.get("forward", {}) if cudnn.get("available") else {})
        else:
            batch_of = rec.get("batch") or batch
            floor = (forward_floor_ms(ceiling, rec.get("shipped_bytes"), rec.get("logits_bytes"), compute,
                                      (rec.get("tail_images") or batch_of) / batch_of) if ceiling else None)
            derived(row, rec.get("host_bytes"), rec.get("flops"), floor,
                    target_for(targets, key, rec.get("input_format", "fp32")))
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

    return BenchFile(
        bench_id=meas.get("bench_id"), measured_at=meas.get("measured_at"), config=meas.get("config"),
        device=meas.get("device"), batch=batch,
        instead=instead_rows(meas, next((r for r in rows if r["kind"] == "forward"), None)),
        instead_note=(meas.get("instead") or {}).get("note"), repeats=meas.get("repeats"), warmup=meas.get("warmup"),
        seed=meas.get("seed"), environment=meas.get("environment"), ceilings=ceilings,
        best={layer: ({"variant": b["variant"], "params": b["resolved_params"], "median_ms": finite(median(b["samples_ms"])),
                       "tied": [{"variant": r["variant"], "params": r["resolved_params"]} for r in rows
                                if r["kind"] == "conv" and r["label"] == layer and r["tied"]]}
                      if b else None) for layer, b in best.items()},
        cudnn={k: v for k, v in cudnn.items()}, targets={**targets, "judged": judged, "device_note": device_note},
        rows=rows).to_json()


def instead_rows(meas: dict, forward: dict | None) -> list[dict]:
    """PyTorch's whole forward the ways a user would run it instead (eager: cuDNN's forward rows;
    a CUDA graph; torch.compile), each with its median, spread and ours/that: our forward's median
    over its (below 1: ours is faster)."""
    cudnn = meas.get("cudnn") or {}
    measured = [{"way": "eager", "mode": mode, "status": "ok" if rec.get("samples_ms") else "failed",
                 "error": rec.get("error"), **rec}
                for mode, rec in (cudnn.get("forward") or {}).items() if mode in INSTEAD_MODES]
    measured += (meas.get("instead") or {}).get("rows", [])
    ours = forward.get("median_ms") if forward and forward.get("status") == "ok" else None
    out = []
    for rec in measured:
        samples = rec.get("samples_ms") or []
        med = median(samples)
        out.append({**rec, "median_ms": finite(med), "max_rel_err": finite(rec.get("max_rel_err")),
                    "spread": finite(relative_spread(samples)) if len(samples) > 1 else None,
                    "ours_over": finite(ours / med) if ours and med else None})
    return out


def _ms(v, digits: int = 3) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{100 * fraction:.1f}"


def params_text(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


def table_rows(result: dict) -> list[list[str]]:
    """The printed table, best row of each conv layer first, then its other candidates."""
    cudnn = result.get("cudnn") or {}
    na = cudnn.get("note") or "n/a"
    out = []

    def line(label: str, row: dict) -> list[str]:
        variant = row.get("variant") or ""
        if row.get("params"):
            variant += f" {params_text(row['params'])}"
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
        return [label, variant, status, _ms(row.get("median_ms")), _percent(row.get("spread")), _ms(row.get("min_ms")),
                _ms(row.get("GBps"), 0), _ms(row.get("GFLOPps"), 0), _ms(row.get("floor_ms")), _ms(row.get("x_floor"), 2),
                *cells, ratio, _ms(row.get("target_ms"), 2), met]

    rows = result["rows"]
    for layer in dict.fromkeys(r["label"] for r in rows if r["kind"] == "conv"):
        recs = [r for r in rows if r["kind"] == "conv" and r["label"] == layer]
        best = [r for r in recs if r.get("best")]
        if best:
            out.append(line(f"{layer} best", best[0]))
        else:
            out.append([f"{layer} best", "", "no correct candidate"] + [""] * (len(TABLE_HEADERS) - 3))
        out += [line(f"{layer} tied", r) for r in recs if r.get("tied")]  # noise could reorder these and the best
        out += [line(layer, r) for r in recs if not r.get("best") and not r.get("tied")]
    for r in rows:
        if r["kind"] == "forward":
            out.append(line("forward (on device)", r))
        elif r["kind"] == "end_to_end":
            how = (f"{r.get('streams')} streams" + (f", {r['chunks']} x {r['chunk_images']} images" if r.get("chunks") else "")
                   + (", CUDA graph" if r.get("graph") else ""))
            what = f"end to end {r.get('input_format', 'fp32')}"
            out.append(line(f"{what}, batch {r['batch']} ({how})" if r["label"] == "end_to_end_small"
                            else f"{what} ({how})", r))
        elif r["kind"] == "harness":
            out.append(line(f"harness {r['profiler']} (cached job)", r))
    return out


TABLE_HEADERS = ["row", "variant", "status", "ms", "±%", "min ms", "GB/s", "GFLOP/s", "floor ms", "×floor",
                 "cuDNN fp32", "cuDNN tf32", "cuDNN fp16", "ours/cuDNN", "target ms", "met?"]


def format_report(result: dict) -> str:
    c = result["ceilings"]
    head = [f"convsweep bench: {result.get('device')}, batch {result['batch']}, {result.get('repeats')} repeats "
            f"(median of events, after {result.get('warmup')} warm-up passes)",
            "inputs: NOT fresh. Each row times one fixed input again and again, checked against float64 before "
            "and after; a kernel that memoizes would win here. The numbers a sweep stores are the ones held to "
            "inputs no kernel has seen (docs/guarantees.md): `convsweep run-job` a variant "
            "to rank it.",
            f"measured rates (the floors'): device copy {_ms(c.get('dtod_GBps'), 0)} GB/s (read + write); "
            f"pinned H2D {_ms(c.get('h2d_GBps'), 1)} GB/s, D2H {_ms(c.get('d2h_GBps'), 1)} GB/s"]
    matmul = c.get("matmul_TFLOPps")
    if matmul:
        head.append("matmul ceilings (PyTorch): " + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in matmul.items() if v))
    if not result["rows"]:  # --ceilings-only: the rates are the whole answer
        return "\n".join(head)
    table = tabulate(table_rows(result), headers=TABLE_HEADERS, tablefmt="github", disable_numparse=True)
    notes = ["floor (convsweep/device/floors.py): the row's least bytes (inputs, weights, output once each) at the device "
             "copy rate, or its FLOPs at the measured matmul rate of its unit, whichever is longer; forward: every "
             "launched layer's traffic (the whole network fused into one kernel: "
             + (_ms(next((r.get("network_floor_ms") for r in result["rows"] if r["kind"] == "forward"), None)) or "?")
             + " ms); end to end: the input in its format up at the pinned H2D rate, the forward, the logits down, "
             "pipelined over the chunks (the longest stage, plus the others' share of the smallest chunk)",
             "±%: the samples' median absolute deviation in % of their median (one slow repeat does not widen it)",
             "ours/cuDNN: against the cuDNN mode of the variant's precision class (fp32, tf32, fp16)",
             "tied: a candidate the samples cannot tell from the best (the 95% bootstrap interval of its "
             "median over the best's reaches 1)"]
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
    text = "\n".join(head) + "\n\n" + table + "\n\n" + "\n".join(f"- {n}" for n in notes)
    if result.get("instead"):
        text += "\n\n" + instead_table(result)
    if result.get("instead_note"):
        text += f"\n- PyTorch instead (CUDA graph, torch.compile): {result['instead_note']}"
    return text


INSTEAD_HEADERS = ["PyTorch instead", "mode", "status", "ms", "±%", "max rel err", "ready in s", "ours/that"]


def instead_table(result: dict) -> str:
    """What a user would run instead: PyTorch's whole forward (input on the device) against ours."""
    forward = next((r for r in result["rows"] if r["kind"] == "forward"), None)
    ours = forward.get("median_ms") if forward else None
    rows = [[r["way"], r["mode"] + (" channels_last" if r["mode"] == "fp16" else ""),
             r["status"] + (f": {r['error']}"[:60] if r.get("error") else ""), _ms(r.get("median_ms")),
             _percent(r.get("spread")), "" if r.get("max_rel_err") is None else f"{r['max_rel_err']:.1e}",
             _ms(r.get("prepare_s"), 1), _ms(r.get("ours_over"), 2)] for r in result["instead"]]
    return (f"What PyTorch would run instead, the whole forward at batch {result['batch']} with the input on the "
            f"device (ours: {_ms(ours) or 'n/a'} ms; ready in: CUDA graph capture, or compiling and autotuning)\n\n"
            + tabulate(rows, headers=INSTEAD_HEADERS, tablefmt="github", disable_numparse=True))
