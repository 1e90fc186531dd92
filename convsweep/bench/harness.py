"""The harness: a real LeNet job through `convsweep run-job`, as Snakemake starts it, with the best
variants; run twice per profiler so the second run hits the compile cache and its total_s is
what a cached sweep job costs."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from convsweep.sweep.config import JobSpec, RunSpec, variant_label
from convsweep.device.nsys import find_nsys
from convsweep.base.paths import ROOT, relative_to_root
from convsweep.measure.record import ResultFile
from .config import BenchConfig


def run_harness(config: BenchConfig, best: dict[str, dict] | None, batch: int, profilers=("events", "nsys"),
                runs: int = 2, log: Callable[[str], None] = lambda m: None) -> dict:
    """`convsweep run-job` `runs` times per profiler (the same job: the later runs hit the compile
    cache), each a fresh process as Snakemake starts it; total_s is the job's own wall time from
    process start, wall_s the parent's clock around the process."""
    out: dict[str, dict] = {}
    if best is None:
        return {p: {"status": "skipped", "note": "no correct candidate for every conv layer"} for p in profilers}
    network = relative_to_root(config.network_path)
    with tempfile.TemporaryDirectory(prefix="convsweep-harness-") as tmp:
        for profiler in profilers:
            if profiler == "nsys" and find_nsys() is None:
                out[profiler] = {"status": "skipped", "note": "nsys not found (PATH or $NSYS)"}
                continue
            run = RunSpec(experiment="bench-harness", network=network, dataset=config.dataset,
                          variants={layer: best[layer]["variant"] for layer in best},
                          params={layer: best[layer]["resolved_params"] for layer in best}, batch=batch,
                          streams=config.end_to_end["streams"], host_memory=config.end_to_end["host_memory"],
                          repeats=config.harness["repeats"], warmup=config.harness["warmup"], profiler=profiler,
                          chunk_images=config.end_to_end["chunk_images"])
            spec = JobSpec.for_run(run, sweep={"experiment": "bench-harness", "config_path": str(config.path)})
            text = json.dumps({**spec.to_dict(), "sweep": spec.sweep})
            records = []
            for i in range(runs):
                path = Path(tmp) / f"{profiler}-{i}.json"
                log(f"harness: {profiler} job, run {i + 1}/{runs}")
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "run-job", "--spec", text, "--out", str(path)],
                                      capture_output=True, text=True, cwd=ROOT)
                wall = time.perf_counter() - t
                job = ResultFile.from_json(json.loads(path.read_text())) if path.is_file() else None
                records.append({"run": i, "wall_s": wall, "returncode": proc.returncode, **_outcome(job, proc.stderr)})
            cached = records[-1]
            if cached["status"] == "ok" and not all(cached["cache_hits"] or [False]):
                cached["error"] = "the repeated job did not hit the compile cache"
            out[profiler] = {"job_id": spec.job_id, "variant": variant_label(spec.variants),
                             "runs": records}
    return out


def _outcome(job: ResultFile | None, stderr: str) -> dict:
    """What a harness run's result file says of the job's one setting; no file (None): its stderr's last line."""
    if job is None:
        return {"status": "failed", "error": (stderr.strip().splitlines() or ["no result"])[-1], "total_s": None,
                "profiler": None, "phases_s": None, "compile_ms": None, "cache_hits": [], "forward_ms": None}
    m = job.measurements[0]
    assert m.timings is not None  # a job writes each setting's (Measurement.new)
    return {"status": m.status, "error": m.error, "total_s": job.total_s, "profiler": m.profiler,
            "phases_s": m.phases_s, "compile_ms": m.timings.compile_ms, "cache_hits": m.cache_hits(),
            "forward_ms": m.timings.forward_ms}
