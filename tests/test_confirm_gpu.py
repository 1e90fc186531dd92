"""Winners confirmed on a real GPU (skipped with the reason elsewhere): two jobs of one cell measured with events,
then their fastest settings per layer measured again, interleaved, in one process. tests/test_confirm.py checks
the same on the fake GPU with scripted times."""
import pytest

from convsweep.sweep.config import JobSpec
from convsweep.measure.confirm import ConfirmSpec, run_confirm_job
from convsweep.measure.job import run_job as run_one_job
from convsweep.device.nsys import find_nsys

pytestmark = pytest.mark.gpu
SWEEP = {"experiment": "confirm-gpu", "config_hash": "h", "config_path": "x.yaml"}


def job(variant: str, values: dict) -> JobSpec:
    return JobSpec(experiment="confirm-gpu", network="networks/lenet86.yaml", dataset="mnist5k",
                   variants={"conv1": variant, "conv2": variant}, grid=[{"layers": ["conv1", "conv2"], "values": values}],
                   batch=1000, streams=1, host_memory="pinned", repeats=5, warmup=1, profiler="events", checks="fast",
                   energy_window_s=0, sweep=SWEEP)


@pytest.mark.alone  # its verdict rests on a time: no other GPU test beside it
def test_the_fastest_settings_of_a_cell_are_measured_again_interleaved(tmp_path):
    jobs = [job("fused_conv_relu_pool", {"BLOCK": [64, 128, 256]}), job("tf32_sliding_window", {"WARPS": [4, 8]})]
    files = []
    for spec in jobs:
        out = tmp_path / "runs" / f"{spec.job_id}.json"
        assert all(m.status == "ok" for m in run_one_job(spec, out).measurements)
        files.append(str(out))
    assert jobs[0].winners_id == jobs[1].winners_id  # one cell: they differ only in variant and tunables
    written = run_confirm_job(ConfirmSpec("confirm-gpu", jobs[0].winners_id, jobs[0].to_dict(), files, 3, 20),
                              tmp_path / "winners" / "w.json")
    assert written["status"] == "ok" and written["environment"]["gpu"]
    assert 3 <= len(written["candidates"]) <= 5 and all(c["status"] == "ok" for c in written["candidates"])
    assert written["clocks"]["sm_mhz"] and written["clocks_after"]["sm_mhz"]
    for verdict in written["layers"]:
        entries = verdict["entries"]
        assert len(entries) == 3 and entries[0]["standing"] == "winner" and entries[0]["place"] == 1
        assert {e["standing"] for e in entries[1:]} <= {"tied", "slower"}
        for e in entries:
            assert len(e["samples_ms"]) == 20 and all(v > 0 for v in e["samples_ms"])
            # The same events, the same GPU, minutes apart: within a factor of two of the job's own median.
            assert 0.5 < e["median_ms"] / e["first_ms"] < 2.0, e
        assert all(0 <= e["p_value"] <= 1 and e["detectable_ms"] > 0 for e in entries[1:])
        assert entries[0]["median_ms"] <= min(e["median_ms"] for e in entries)


@pytest.mark.skipif(find_nsys() is None, reason="nsys is not installed")
@pytest.mark.alone  # its verdict rests on a time: no other GPU test beside it
def test_a_held_stream_times_a_small_batch_kernel_as_nsys_does(tmp_path):
    """At batch 100 a conv kernel runs for microseconds, less than the host takes to launch it: events around it
    without the hold measured the launches (47 us for a kernel nsys timed at 5 us, on the lent H100)."""
    spec = job("fp16_sliding_window", {"WARPS": [4, 8]})
    spec = JobSpec.from_dict({**spec.to_dict(), "batch": 100, "profiler": "nsys"}, sweep=SWEEP)
    out = tmp_path / "runs" / "fp16.json"
    assert all(m.status == "ok" and m.profiler == "nsys" for m in run_one_job(spec, out).measurements)
    written = run_confirm_job(ConfirmSpec("confirm-gpu", spec.winners_id, spec.to_dict(), [str(out)], 2, 30),
                              tmp_path / "w.json")
    for verdict in written["layers"]:
        for e in verdict["entries"]:
            assert 0.8 < e["median_ms"] / e["first_ms"] < 1.6, (verdict["layer"], e["median_ms"], e["first_ms"])
