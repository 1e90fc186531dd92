"""One job end to end on the CPU: the reference variant, and failures that are stored, not lost."""
import json
import time

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
    result = run_job(spec(), out, process_age=None)
    stored = json.loads(out.read_text())
    assert stored == json.loads(json.dumps(result))
    assert stored["status"] == "ok", stored["error"]
    assert stored["profiler"] == "cpu" and stored["format"] == 2
    assert stored["max_rel_err"] < 1e-5 and 0.8 < stored["accuracy"] <= 1.0
    assert set(stored["timings"]["op_time_ms"]) == {"conv1", "conv2"}
    assert all(v > 0 for v in stored["timings"]["op_time_ms"].values())
    assert stored["timings"]["h2d_ms"] is None  # not measurable on the CPU: null, never guessed
    assert len([s for s in stored["samples"] if s["metric"] == "op_time_ms"]) == 2 * 2
    assert stored["run_key"] == spec().run_key and stored["job_id"] == spec().job_id
    assert stored["images"] == {"batch": 40, "unique": 5000, "cycled": False}
    assert stored["floors"]["conv2"]["flops"] == 2 * 40 * 16 * 34 * 34 * 4 * 49
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left nothing behind


def test_process_age_is_the_start_phase_and_counted_in_total_s(tmp_path):
    t = time.perf_counter()
    result = run_job(spec(profiler="events"), tmp_path / "r.json", process_age=1.5)
    wall = time.perf_counter() - t
    phases = result["phases_s"]
    assert phases["process_start"] == 1.5  # not replaced by the measured phases
    assert {"load", "warmup", "timed", "check"} <= set(phases)
    assert sum(phases.values()) <= result["timings"]["total_s"] <= 1.5 + wall


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


def test_random_workloads_run_on_the_cpu_reference(tmp_path):
    job = spec(network="networks/fp64_stride5.yaml", dataset="random", variants={"conv1": "reference"},
               params={"conv1": {}}, batch=16)
    result = run_job(job, tmp_path / "r.json")
    assert result["status"] == "ok", result["error"]
    assert result["accuracy"] is None and result["prediction_agreement"] is None
    assert result["max_rel_err"] < 1e-12  # float64 network, float64 CPU reference
    assert result["floors"]["conv1"]["bytes"] == 8 * (16 * 100 * 100 + 10 * 25 + 10 + 16 * 10 * 20 * 20)


def test_each_run_is_a_new_measurement_with_its_provenance(tmp_path):
    import subprocess

    from convsweep.compile import source_hash
    from convsweep.paths import KERNELS_DIR, ROOT

    first = run_job(spec(batch=8, repeats=1, warmup=0), tmp_path / "r.json")
    again = run_job(spec(batch=8, repeats=1, warmup=0), tmp_path / "r.json")
    assert first["run_key"] == again["run_key"] and first["measurement_id"] != again["measurement_id"]
    assert len(first["measurement_id"]) == 32
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert first["git"]["commit"] == head.stdout.strip() and isinstance(first["git"]["dirty"], bool)
    assert first["clocks"] == {"sm_mhz": None, "memory_mhz": None}  # no GPU timed: null, never guessed
    assert first["sources"] == {}  # the CPU reference runs no kernel
    gpu_job = run_job(spec(variants={"conv1": "naive", "conv2": "naive"}, batch=8), tmp_path / "g.json")
    # Known before anything compiles, so even a run that failed says what code it tried
    assert gpu_job["sources"] == {"kernels/naive.cu": source_hash(KERNELS_DIR / "naive.cu"),
                                  "kernels/layers.cu": source_hash(KERNELS_DIR / "layers.cu")}


def test_a_killed_writers_temporary_files_are_cleared(tmp_path):
    out = tmp_path / "r.json"
    stale = tmp_path / ".r.json.abc123.tmp"
    stale.write_text('{"half": ')
    run_job(spec(batch=8, repeats=1, warmup=0), out)
    assert not stale.exists() and json.loads(out.read_text())["status"] == "ok"
