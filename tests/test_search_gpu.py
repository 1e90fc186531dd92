"""A guided search in a job on a real GPU (skipped with the reason elsewhere): with events, and under nsys, whose
child process runs the search and is told what a resumed job measured before. tests/test_search.py checks the
same on the fake GPU."""
import json
import shutil

import pytest

from convsweep.sweep.config import JobSpec
from convsweep.measure.job import run_job as run_one_job
from convsweep.device.nsys import find_nsys

pytestmark = pytest.mark.gpu
SWEEP = {"experiment": "search-gpu", "config_hash": "h", "config_path": "x.yaml"}
SEARCH = {"strategy": "tpe", "budget": 6, "seed": 3}


def job(profiler: str) -> JobSpec:
    """tf32_sliding_window with each conv layer tuned on its own: 24 x 24 candidates less the restrictions'."""
    values = {"WARPS": [4, 8], "PR": [1, 2], "STAGED": [0, 1, 2], "MAP_SPLIT": [1, 2]}
    return JobSpec(experiment="search-gpu", network="networks/lenet86.yaml", dataset="mnist5k",
                   variants={"conv1": "tf32_sliding_window", "conv2": "tf32_sliding_window"},
                   grid=[{"layers": ["conv1"], "values": values}, {"layers": ["conv2"], "values": values}],
                   search=SEARCH, batch=1000, streams=1, host_memory="pinned", repeats=3, warmup=1,
                   profiler=profiler, checks="fast", energy_window_s=0, sweep=SWEEP)


def check(result, spec: JobSpec) -> None:
    ms = result.measurements
    assert [m.grid.proposal for m in ms] == list(range(6)) and len({m.run_key for m in ms}) == 6
    assert all(m.status == "ok" and m.grid.valid == spec.settings().valid > 6 for m in ms)
    assert all(m.timings.op_time_ms["conv1"] > 0 and m.timings.op_time_ms["conv2"] > 0 for m in ms)


def test_a_guided_job_measures_its_budget_with_events(tmp_path):
    spec = job("events")
    result = run_one_job(spec, tmp_path / "tpe.json")
    check(result, spec)
    assert all(m.profiler == "events" for m in result.measurements)


@pytest.mark.skipif(find_nsys() is None, reason="nsys is not installed")
def test_a_guided_job_under_nsys_resumes_its_search_in_the_child(tmp_path):
    spec = job("nsys")
    out = tmp_path / "runs" / "tpe.json"
    first = run_one_job(spec, out)
    check(first, spec)
    assert all(m.profiler == "nsys" for m in first.measurements)
    # Half of it left behind as an interrupted job's: the child is told those and proposes the rest.
    from convsweep.measure import context as context_mod, job as job_mod

    kept = first.measurements[:3]
    store = job_mod.ResumeStore(out, job_mod.resume_key(context_mod.JobContext.open(spec)))
    out.unlink()
    shutil.rmtree(out.with_suffix(""), ignore_errors=True)
    for m in kept:
        store.put(m)
    again = run_one_job(spec, out)
    check(again, spec)
    assert [m.measurement_id for m in again.measurements[:3]] == [m.measurement_id for m in kept]
    assert again.settings.resumed == 3 and again.settings.measured == 3
    assert json.loads(out.read_text())["settings"]["resumed"] == 3
