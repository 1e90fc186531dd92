"""`sanitize: true` in an experiment: after each setting is measured, one checked pass of it runs again under
compute-sanitizer, once with memcheck (reads and writes outside an allocation, misaligned accesses) and once
with initcheck (reads of device memory nothing wrote), in a child process (`convsweep run-job` of the setting
alone, to a file that is thrown away) that shares the job's hold on the GPU. An error is the setting's verdict: `incorrect`, with the tool's first line.
Where compute-sanitizer is not installed, the measurement says so and keeps its verdict.

The pass is the harness's own: round 0 (checked), then one fresh round, timed and checked (convsweep.measure.settings);
its time under the sanitizer means nothing and is not kept.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from convsweep.base.heartbeat import without_heartbeat
from .config import RunSpec

TOOLS = ("memcheck", "initcheck")
# Bytes of no-man's-land the sanitizer puts after each allocation: buffers from one memory pool lie end to end, so
# a write a little past one lands inside the next and memcheck, which knows allocations and not intent, sees nothing.
PADDING_BYTES = 1 << 20
TIMEOUT_S = 900  # a sanitized pass runs ten to a hundred times slower than a timed one
_SUMMARY = re.compile(r"=+\s*ERROR SUMMARY:\s*(\d+) error")
_FIRST = re.compile(r"^=+\s+(?!ERROR SUMMARY|COMPUTE-SANITIZER|Program hit|\s)(.+)$", re.M)


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else in the CUDA toolkit's usual place; None where neither has it."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for candidate in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = Path(candidate) / "bin" / "compute-sanitizer"
        if candidate and path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def sanitized_run(run: RunSpec) -> RunSpec:
    """The setting as the sanitizer runs it: one timed pass after the checked seed pass, events, fast checks."""
    return RunSpec(**{**run.to_dict(), "repeats": 1, "warmup": 1, "profiler": "events", "checks": "fast",
                      "sanitize": False, "stopping": None})


def read_report(output: str) -> dict:
    """{errors, first}: the tool's error count (its summary line) and its first line about one."""
    summary = _SUMMARY.search(output)
    first = _FIRST.search(output)
    if summary is None:
        return {"errors": None, "first": (output.strip().splitlines() or ["no output"])[-1][:300]}
    errors = int(summary.group(1))
    return {"errors": errors, "first": first.group(1).strip()[:300] if errors and first else None}


def sanitize(run: RunSpec, sanitizer: str | None = None) -> dict:
    """Each tool's report on one checked pass of `run` (read_report), or {"problem": why} where none could run."""
    from .config import JobSpec

    sanitizer = sanitizer or find_sanitizer()
    if sanitizer is None:
        return {"problem": "compute-sanitizer is not installed here: nothing was sanitized"}
    spec = json.dumps(JobSpec.for_run(sanitized_run(run)).to_dict())
    found: dict = {}
    with tempfile.TemporaryDirectory(prefix="convsweep-sanitize-") as tmp:
        for tool in TOOLS:
            # --worker: measured in the sanitized process itself, which no deadline watches (TIMEOUT_S bounds it)
            command = [sanitizer, "--tool", tool, "--padding", str(PADDING_BYTES), "--print-limit", "20",
                       sys.executable, "-m", "convsweep", "run-job", "--spec", spec, "--out", str(Path(tmp) / f"{tool}.json"),
                       "--worker"]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                                      env=without_heartbeat())
            except subprocess.TimeoutExpired:
                found[tool] = {"errors": None, "first": f"no answer in {TIMEOUT_S} s"}
                continue
            found[tool] = read_report(done.stdout + "\n" + done.stderr)
    return found


def verdict(found: dict) -> str | None:
    """The setting's error where a tool found one (or could not say): None where each found none."""
    for tool in TOOLS:
        report = found.get(tool)
        if report is None:
            continue
        if report["errors"] is None:
            return f"compute-sanitizer {tool} did not finish: {report['first']}"
        if report["errors"]:
            return f"compute-sanitizer {tool}: {report['errors']} errors; the first: {report['first']}"
    return None
