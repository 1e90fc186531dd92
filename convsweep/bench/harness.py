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

from ..config import JobSpec, RunSpec, variant_label
from ..nsys import find_nsys
from ..paths import ROOT, relative_to_root
from .config import BenchConfig


def run_harness(config: BenchConfig, best: dict[str, dict] | None, batch: int, profilers=("events", "nsys"),
                runs: int = 2, log: Callable[[str], None] = lambda m: None) -> dict:
    """`convsweep run-job` `runs` times per profiler (the same job: the later runs hit the compile
    cache), each a fresh process as Snakemake starts it; total_s is the job's own wall time from
    process start, wall_s the parent's clock around the process."""
    out = {}
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
                proc = subprocess.run([sys.executable, "-m", "convsweep.cli", "run-job", "--spec", text, "--out", str(path)],
                                      capture_output=True, text=True, cwd=ROOT)
                wall = time.perf_counter() - t
                job = json.loads(path.read_text()) if path.is_file() else {}
                result = (job.get("measurements") or [{}])[0]  # the job's one setting
                builds = result.get("builds") or []
                records.append({"run": i, "wall_s": wall, "returncode": proc.returncode,
                                "status": result.get("status", "failed"),
                                "error": result.get("error") or (None if result else (proc.stderr.strip().splitlines() or ["no result"])[-1]),
                                "total_s": job.get("total_s"), "profiler": result.get("profiler"),
                                "phases_s": result.get("phases_s"), "compile_ms": (result.get("timings") or {}).get("compile_ms"),
                                "cache_hits": [b.get("cache_hit") for b in builds],
                                "forward_ms": (result.get("timings") or {}).get("forward_ms")})
            cached = records[-1]
            if cached["status"] == "ok" and not all(cached["cache_hits"] or [False]):
                cached["error"] = "the repeated job did not hit the compile cache"
            out[profiler] = {"job_id": spec.job_id, "variant": variant_label(spec.variants),
                             "runs": records}
    return out
