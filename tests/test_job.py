"""One job end to end on the CPU: the reference variant, and failures that are stored, not lost."""
import json

import pytest

from convsweep.config import JobSpec
from convsweep.gpu import gpu_available
from convsweep.job import run_job


def spec(**over) -> JobSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "reference", "conv2": "reference"}, params={"conv1": {}, "conv2": {}},
                batch=40, streams=1, host_memory="pageable", repeats=2, warmup=1, profiler="events",
                sweep={"experiment": "t", "config_hash": "h", "config_path": "x.yaml"})
    base.update(over)
    return JobSpec(**base)


def test_reference_job_writes_a_complete_result(tmp_path):
    out = tmp_path / "r.json"
    result = run_job(spec(), out, process_start=None)
    stored = json.loads(out.read_text())
    assert stored == json.loads(json.dumps(result))
    assert stored["status"] == "ok", stored["error"]
    assert stored["profiler"] == "cpu" and stored["format"] == 1
    assert stored["max_rel_err"] < 1e-5 and 0.8 < stored["accuracy"] <= 1.0
    assert set(stored["timings"]["op_time_ms"]) == {"conv1", "conv2"}
    assert all(v > 0 for v in stored["timings"]["op_time_ms"].values())
    assert stored["timings"]["h2d_ms"] is None  # not measurable on the CPU: null, never guessed
    assert len([s for s in stored["samples"] if s["metric"] == "op_time_ms"]) == 2 * 2
    assert stored["run_key"] == spec().run_key and stored["job_id"] == spec().job_id
    assert stored["images"] == {"batch": 40, "unique": 5000, "cycled": False}
    assert stored["floors"]["conv2"]["flops"] == 2 * 40 * 16 * 34 * 34 * 4 * 49
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left nothing behind


def test_batches_larger_than_the_set_cycle_and_say_so(tmp_path):
    result = run_job(spec(batch=5003, repeats=1, warmup=0), tmp_path / "r.json")
    assert result["status"] == "ok" and result["images"]["cycled"] is True


def test_missing_dataset_is_a_stored_failure(tmp_path):
    bad = spec(dataset={"name": "fashion", "images": str(tmp_path / "nope-images.gz"), "labels": str(tmp_path / "nope-labels.gz")})
    result = run_job(bad, tmp_path / "r.json")
    assert result["status"] == "failed" and "nope-images.gz" in result["error"]
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"


@pytest.mark.skipif(gpu_available()[0], reason="checks the failure path of a machine without a GPU")
def test_gpu_variant_without_gpu_is_a_stored_failure(tmp_path):
    result = run_job(spec(variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}}), tmp_path / "r.json")
    assert result["status"] == "failed"
    assert "CUDA device" in result["error"] and "\n" not in result["error"]
