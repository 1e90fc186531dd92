"""Nsight Systems: run a command under `nsys profile`, read its SQLite export.

Kernels and copies are attributed to a tunable setting, a repeat and a layer through the NVTX
ranges the job pushes ("setting 2" > "repeat 3" > "chunk 0" > "conv1"): a GPU activity belongs
to the ranges that were open on the launching thread when its API call was made (matched by
correlation id), which is how nsys itself projects NVTX ranges onto the GPU.
"""
from __future__ import annotations

import bisect
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import canonical_hash, write_atomic
from convsweep.base.numbers import median
from convsweep.base.paths import cache_dir

_REPEAT = re.compile(r"^repeat (\d+)$")
_SETTING = re.compile(r"^setting (\d+)$")
_CUPTI_COPY_KIND = {1: "H2D", 2: "D2H", 8: "D2D", 10: "P2P"}


def find_nsys() -> str | None:
    """$NSYS, else `nsys` on PATH, where it is an executable file; None otherwise (a $NSYS naming nothing
    is no nsys: a job would only find out when its profile could not start)."""
    return shutil.which(os.environ.get("NSYS") or "nsys")


def nsys_version(nsys: str) -> str | None:
    """`nsys --version`, remembered on disk per nsys binary: asking costs a job a few tenths of a second."""
    try:
        stat = os.stat(nsys)
    except OSError:
        return None
    memo = cache_dir() / "nsys-version" / canonical_hash([os.path.realpath(nsys), stat.st_mtime_ns, stat.st_size])
    try:
        return memo.read_text() or None
    except OSError:
        pass
    try:
        out = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+\.\d+[\w.\-]*)", out)
    version = match.group(1) if match else out.strip() or None
    try:
        write_atomic(memo, version or "")
    except OSError:  # a full or read-only cache: the next job asks nsys again
        pass
    return version


def profile(command: list[str], report_base: Path, nsys: str, log) -> Path:
    """Run `command` under nsys with CUDA and NVTX tracing; return the SQLite export's path."""
    report_base.parent.mkdir(parents=True, exist_ok=True)
    # CUDA API and kernels, NVTX; no CPU sampling, context switches or CUDA event records (the
    # job times with events itself, and nothing reads their trace).
    args = [nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-event-trace=false",
            "--export=sqlite", "--force-overwrite=true", "-o", str(report_base), *command]
    # Lines pass through as they come, so a job waiting for its GPU says so while it waits; nsys
    # draws progress bars with carriage returns: keep the job's own lines and nsys's messages.
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            kept = line.rstrip("\n").split("\r")[-1]
            if kept and not kept.lstrip().startswith("["):
                print(kept, file=log or sys.stdout, flush=True)
    sqlite_path = report_base.with_suffix(".sqlite")
    if proc.returncode != 0:
        raise ConvsweepError(f"nsys profile exited with {proc.returncode} (see the job log)")
    if not sqlite_path.is_file():
        raise ConvsweepError(f"nsys wrote no SQLite export at {sqlite_path}")
    return sqlite_path


@dataclass(frozen=True)
class Activity:
    """One kernel or copy on the GPU, with the NVTX context of its launch."""

    kind: str  # kernel | H2D | D2H | D2D ... | memset
    name: str
    start_ns: int
    end_ns: int
    stream: int
    repeat: int | None  # None: warm-up or outside the timed loop
    layer: str | None
    setting: int | None = None  # the job's setting (its index among those the process measured)
    bytes: int = 0
    grid: tuple = ()
    block: tuple = ()
    registers: int = 0
    static_shared_bytes: int = 0
    dynamic_shared_bytes: int = 0
    local_bytes: int = 0

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _tables(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def read_activities(sqlite_path: Path, layer_names: set[str]) -> list[Activity]:
    """Every kernel and memcpy in the export, attributed to (repeat, layer) where NVTX says so."""
    db = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    try:
        tables = _tables(db)
        strings = dict(db.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
        ranges = _nvtx_ranges(db, tables, strings)
        calls = {}
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            calls = {corr: (start, tid) for start, tid, corr in
                     db.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
        out = []
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
            for row in db.execute(
                    "SELECT start, end, streamId, correlationId, shortName, gridX, gridY, gridZ, blockX, blockY, blockZ,"
                    " registersPerThread, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread"
                    " FROM CUPTI_ACTIVITY_KIND_KERNEL"):
                setting, repeat, layer = _context(calls.get(row[3]), ranges, layer_names)
                out.append(Activity("kernel", strings.get(row[4], str(row[4])), row[0], row[1], row[2], repeat, layer,
                                    setting=setting, grid=tuple(row[5:8]), block=tuple(row[8:11]), registers=row[11],
                                    static_shared_bytes=row[12], dynamic_shared_bytes=row[13], local_bytes=row[14]))
        if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
            kinds = dict(_CUPTI_COPY_KIND)
            if "ENUM_CUDA_MEMCPY_OPER" in tables:
                for id_, name in db.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"):
                    kinds[id_] = {"CUDA_MEMCPY_OPER_HTOD": "H2D", "CUDA_MEMCPY_OPER_DTOH": "D2H",
                                  "CUDA_MEMCPY_OPER_DTOD": "D2D"}.get(name, kinds.get(id_, name))
            for start, end, stream, corr, nbytes, kind in db.execute(
                    "SELECT start, end, streamId, correlationId, bytes, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
                setting, repeat, layer = _context(calls.get(corr), ranges, layer_names)
                copy_kind = kinds.get(kind, str(kind))
                out.append(Activity(copy_kind, copy_kind, start, end, stream, repeat, layer, setting=setting,
                                    bytes=nbytes))
        if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:  # a cold pass's L2 flushes (Gpu.l2_flusher)
            for start, end, stream, corr, nbytes in db.execute(
                    "SELECT start, end, streamId, correlationId, bytes FROM CUPTI_ACTIVITY_KIND_MEMSET"):
                setting, repeat, layer = _context(calls.get(corr), ranges, layer_names)
                out.append(Activity("memset", "memset", start, end, stream, repeat, layer, setting=setting, bytes=nbytes))
        return sorted(out, key=lambda a: a.start_ns)
    finally:
        db.close()


def _nvtx_ranges(db, tables, strings) -> dict[int, list[tuple[int, int, str]]]:
    """Push/pop and start/end ranges per thread, sorted by start."""
    per_thread: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    if "NVTX_EVENTS" not in tables:
        return per_thread
    for start, end, text, text_id, tid in db.execute(
            "SELECT start, end, text, textId, globalTid FROM NVTX_EVENTS WHERE end IS NOT NULL"):
        per_thread[tid].append((start, end, text if text is not None else strings.get(text_id, "")))
    for ranges in per_thread.values():
        ranges.sort()
    return per_thread


def _context(call, ranges, layer_names) -> tuple[int | None, int | None, str | None]:
    """(setting, repeat, layer) of the ranges open around an API call."""
    if call is None:
        return None, None, None
    start, tid = call
    thread_ranges = ranges.get(tid, [])
    setting = repeat = layer = None
    upto = bisect.bisect_right(thread_ranges, (start, float("inf"), ""))
    for r_start, r_end, text in thread_ranges[:upto]:
        if r_start <= start <= r_end:
            if (m := _REPEAT.match(text)):
                repeat = int(m.group(1))
            elif (m := _SETTING.match(text)):
                setting = int(m.group(1))
            elif text in layer_names:
                layer = text
    return setting, repeat, layer


def _union_ns(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _overlap_ns(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _max_concurrency(intervals: list[tuple[int, int, int]]) -> int:
    """Most distinct streams busy at one instant."""
    points = sorted([(s, 1, st) for s, e, st in intervals] + [(e, -1, st) for s, e, st in intervals],
                    key=lambda p: (p[0], p[1]))
    busy: dict[int, int] = defaultdict(int)
    best = 0
    for _, delta, stream in points:
        busy[stream] += delta
        best = max(best, sum(1 for v in busy.values() if v > 0))
    return best


def summarize_settings(activities: list[Activity], conv_layers: list[str],
                       discarded: dict[int | None, list[int]] | None = None) -> dict[int | None, dict]:
    """summarize() of each setting's activities, by setting index (None: outside any setting); `discarded`:
    by setting, the repeats that did not count."""
    by_setting: dict[int | None, list[Activity]] = defaultdict(list)
    for a in activities:
        by_setting[a.setting].append(a)
    return {setting: summarize(acts, conv_layers, (discarded or {}).get(setting, ()))
            for setting, acts in by_setting.items()}


def summarize(activities: list[Activity], conv_layers: list[str], discarded=()) -> dict:
    """Per-repeat samples and their medians, plus per-kernel and per-direction totals. `discarded`: repeat
    labels of passes that did not count (record.Stopping); the rest are numbered again in order."""
    counted = sorted({a.repeat for a in activities if a.repeat is not None} - set(discarded))
    number = {label: n for n, label in enumerate(counted)}
    timed = [replace(a, repeat=number[a.repeat]) for a in activities if a.repeat in number]
    repeats = sorted({cast(int, a.repeat) for a in timed})  # each numbered again above
    samples = []
    per_metric: dict[tuple, list[float]] = defaultdict(list)

    def add(metric, layer, repeat, value):
        samples.append({"metric": metric, "layer": layer, "repeat": repeat, "value": value})
        per_metric[(metric, layer)].append(value)

    for r in repeats:
        acts = [a for a in timed if a.repeat == r]
        kernels = [a for a in acts if a.kind == "kernel"]
        copies = [a for a in acts if a.kind in ("H2D", "D2H")]
        for layer in conv_layers:
            add("op_time_ms", layer, r, sum(a.ms for a in kernels if a.layer == layer))
        kernel_union = _union_ns([(a.start_ns, a.end_ns) for a in kernels])
        copy_union = _union_ns([(a.start_ns, a.end_ns) for a in copies])
        add("h2d_ms", None, r, sum(a.ms for a in copies if a.kind == "H2D"))
        add("d2h_ms", None, r, sum(a.ms for a in copies if a.kind == "D2H"))
        add("compute_ms", None, r, sum(e - s for s, e in kernel_union) / 1e6)
        # A cold pass writes over L2 between its layers (memsets, on its one stream): the pass's
        # time leaves them out, as the events' time does.
        flush_ms = sum(a.ms for a in acts if a.kind == "memset")
        if acts:
            add("forward_ms", None, r, (max(a.end_ns for a in acts) - min(a.start_ns for a in acts)) / 1e6 - flush_ms)
        if flush_ms:
            add("l2_flush_ms", None, r, flush_ms)
        copy_ns = sum(e - s for s, e in copy_union)
        add("overlap", None, r, _overlap_ns(copy_union, kernel_union) / copy_ns if copy_ns else 0.0)
        add("streams_used", None, r, float(_max_concurrency([(a.start_ns, a.end_ns, a.stream) for a in acts])))

    medians = {key: median(values) for key, values in per_metric.items()}
    per_kernel: dict[tuple[str | None, str], list[Activity]] = defaultdict(list)
    for a in timed:
        if a.kind == "kernel":
            per_kernel[(a.layer, a.name)].append(a)
    kernel_rows = [{
        "layer": layer, "name": name, "launches": len(acts), "total_ms": sum(a.ms for a in acts),
        "median_ms": median(a.ms for a in acts), "grid": list(acts[0].grid), "block": list(acts[0].block),
        "registers": acts[0].registers, "static_shared_bytes": acts[0].static_shared_bytes,
        "dynamic_shared_bytes": acts[0].dynamic_shared_bytes, "local_bytes": acts[0].local_bytes,
    } for (layer, name), acts in sorted(per_kernel.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]
    per_kind: dict[str, list[Activity]] = defaultdict(list)
    for a in timed:
        if a.kind not in ("kernel", "memset"):
            per_kind[a.kind].append(a)
    copy_rows = [{"kind": kind, "count": len(acts), "bytes": sum(a.bytes for a in acts),
                  "total_ms": sum(a.ms for a in acts)} for kind, acts in sorted(per_kind.items())]
    return {
        "op_time_ms": {layer: medians.get(("op_time_ms", layer)) for layer in conv_layers},
        "h2d_ms": medians.get(("h2d_ms", None)), "d2h_ms": medians.get(("d2h_ms", None)),
        "compute_ms": medians.get(("compute_ms", None)), "forward_ms": medians.get(("forward_ms", None)),
        "overlap": medians.get(("overlap", None)), "streams_used": medians.get(("streams_used", None)),
        "repeats_seen": len(repeats), "samples": samples, "kernels": kernel_rows, "memcpys": copy_rows,
    }
