"""A course's store for the leaderboard's tests: submissions' runs (`<submission>__<variant>`) whose per-pass samples
are drawn with numpy, on two GPU models and two batches, with each way a run can fail to rank."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import text

from store_fixtures import make_job_file, make_result

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
EXPERIMENT = "ece408-fa26"
CHEAT_FINDINGS = {"s05__memo_forward": ["global_write", "clock"]}
REASONS = {
    "incorrect": "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)",
    "suspect": "caching test: sighting 2 of a round took 0.41x its first (in each of 3 rounds, more than the 5% "
               "noise allows)",
    "failed": "compile failed: s06__broken.cu(12): error: identifier TILE undefined",
    "timeout": "timed out after 600 s",
}


def drawn(rng: np.random.Generator, conv1_ms: float, conv2_ms: float, n: int = 30, noise: float = 0.01
          ) -> list[tuple[float, float]]:
    """n passes' (conv1, conv2) op times, each layer normal around its time with `noise` of it as its deviation."""
    return [(float(a), float(b)) for a, b in zip(rng.normal(conv1_ms, noise * conv1_ms, n),
                                                  rng.normal(conv2_ms, noise * conv2_ms, n))]


def course_run(variant: str, passes: list[tuple[float, float]] | None, batch: int = 10000, gpu: str = H100,
               status: str = "ok", checks: str | None = "full", findings: dict[str, list[str]] | None = None,
               experiment: str = EXPERIMENT, fresh: bool = True) -> dict[str, Any]:
    """One setting of one submission's variant as a format 3 job file: ok with its passes' samples, or incorrect,
    suspect or failed with its reason; `checks` full or fast (None: no integrity checks ran); not `fresh`: a timed
    pass ran on inputs its kernel had seen (a run stored before every pass was fresh)."""
    timed = status != "failed"
    passes = passes or [(1.0, 2.0)] * 3
    medians = tuple(float(np.median([p[layer] for p in passes])) for layer in (0, 1))
    result = make_result(variant, batch, status=status, op_time_ms=medians, experiment=experiment)
    result["environment"]["gpu"] = gpu
    result["error"] = REASONS.get(status)
    if timed:
        result["samples"] = [{"metric": "op_time_ms", "layer": layer, "repeat": r, "value": p[i]}
                             for r, p in enumerate(passes) for i, layer in enumerate(("conv1", "conv2"))]
        result["samples"] += [{"metric": "forward_ms", "layer": None, "repeat": r, "value": sum(p) + 4.0}
                              for r, p in enumerate(passes)]
        result["timings"]["forward_ms"] = sum(medians) + 4.0
        if checks is not None:
            result["integrity"] = {"checks": checks, "checked_passes": len(passes), "failed_pass": None,
                                   "fresh_passes": len(passes) - (not fresh), "reasons": []}
        for build in result["builds"]:
            build["findings"] = findings or {}
    return make_job_file([result])


def course_files(seed: int = 408) -> list[dict[str, Any]]:
    """The course: on the H100 at batch 10000, s01 and s02 drawn from one distribution (one tier), s01's second
    variant slower than its first, s03 clearly slower (the next tier), s04 incorrect, s05 suspect (with findings),
    s06 failed, s07 measured with fast checks, s08 with 2 samples, s09 to be marked timed out (timed_out); on the
    A100 at batch 10000, s01 and s03, s03 the faster there; on the H100 at batch 1000, s01."""
    rng = np.random.default_rng(seed)
    return [
        course_run("s01__tiled", drawn(rng, 20.0, 50.0)),
        course_run("s01__naive", drawn(rng, 22.0, 53.0)),
        course_run("s02__fused", drawn(rng, 20.0, 50.0)),
        course_run("s03__slow", drawn(rng, 26.0, 64.0)),
        course_run("s04__wrong", drawn(rng, 5.0, 10.0), status="incorrect"),
        course_run("s05__memo", drawn(rng, 2.0, 4.0), status="suspect", findings=CHEAT_FINDINGS),
        course_run("s06__broken", None, status="failed"),
        course_run("s07__quick", drawn(rng, 18.0, 45.0), checks="fast"),
        course_run("s08__few", drawn(rng, 30.0, 70.0, n=2)),
        course_run("s09__slowpoke", drawn(rng, 40.0, 90.0)),
        course_run("s01__tiled", drawn(rng, 30.0, 75.0), gpu=A100),
        course_run("s03__slow", drawn(rng, 25.0, 60.0), gpu=A100),
        course_run("s01__tiled", drawn(rng, 2.0, 5.0), batch=1000),
    ]


def mark_timed_out(engine, variant: str = "s09__slowpoke") -> None:
    """Store `variant`'s runs as timed out, the status a later result format may write."""
    with engine.begin() as connection:
        connection.execute(text("UPDATE run SET status = 'timeout', error = :error WHERE variant = :variant"),
                           {"error": REASONS["timeout"], "variant": variant})
