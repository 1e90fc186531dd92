"""`convsweep bench` on the CPU: the bench file, the floor arithmetic, the result and table shaping
with fake numbers, and the whole bench over a fake GPU (numpy memory, numpy kernels) so the
plumbing between the phases runs here; the real thing is the gpu-marked test at the end."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from convsweep import bench
from convsweep.bench import cudnn, report
from convsweep.bench.harness import run_harness
from convsweep.model.checks import check_indices, check_output, loosest_precision, normwise_error
from convsweep.base.errors import ConfigError
from convsweep.base.fileio import write_json_atomic
from convsweep.device.floors import Ceiling, Work, work_floor_ms
from convsweep.model.network import load_network, reference_forward
from convsweep.base.paths import ROOT
from convsweep.measure.runner import pass_chunks

from bench_files import GOOD, write
from fake_gpu import FAKE, FakeGpu

LENET = load_network(ROOT / "networks/lenet86.yaml")


# -- arithmetic ----------------------------------------------------------------------------------
def test_floor_arithmetic_matches_the_design_anchors():
    rate = report.copy_rate(1 << 30, (2 * (1 << 30)) / 2.99e12 * 1e3)  # a 1 GiB copy at 2.99 TB/s (read + write)
    assert rate == pytest.approx(2.99e12)
    conv1 = LENET.conv_shape(LENET.layer("conv1"), 10000)
    conv2 = LENET.conv_shape(LENET.layer("conv2"), 10000)
    copy_only = Ceiling(None, rate)  # no matmul rate measured: the floors count bytes alone
    assert work_floor_ms(copy_only, Work(conv1.min_bytes)) == pytest.approx(0.44, abs=0.005)  # DESIGN.md: 0.44 ms
    assert work_floor_ms(copy_only, Work(conv2.min_bytes)) == pytest.approx(0.33, abs=0.005)  # DESIGN.md: 0.33 ms
    assert conv2.flops / 1e9 == pytest.approx(72.5, abs=0.05)
    # With the fp32 CUDA cores' measured 50 TFLOP/s, conv2's FLOPs take longer than its bytes: that is its floor.
    fp32 = Ceiling(None, rate, flops_per_s={"fp32": 50e12, "fp16": 700e12})
    assert work_floor_ms(fp32, Work(conv2.min_bytes, conv2.flops, "fp32")) == pytest.approx(conv2.flops / 50e12 * 1e3)
    assert work_floor_ms(fp32, Work(conv2.min_bytes, conv2.flops, "fp16")) == pytest.approx(0.33, abs=0.005)
    assert report.copy_rate(1000, 1.0, read_and_write=False) == 1e6
    assert report.throughput(2_000_000, 3_000_000, 2.0) == (1.0, 1.5)  # GB/s, GFLOP/s
    assert report.throughput(1, 1, 0) == (None, None)


def test_network_traffic_counts_every_launched_step():
    t = report.network_traffic(LENET, 1, {})
    e = 4
    conv1 = LENET.conv_shape(LENET.layer("conv1"), 1).min_bytes
    conv2 = LENET.conv_shape(LENET.layer("conv2"), 1).min_bytes
    relu1, pool1 = 2 * e * 4 * 80 * 80, e * (4 * 80 * 80 + 4 * 40 * 40)
    relu2, pool2 = 2 * e * 16 * 34 * 34, e * (16 * 34 * 34 + 16 * 8 * 8)
    fc1, fc2 = e * (1024 + 32 * 1024 + 32 + 32), e * (32 + 10 * 32 + 10 + 10)  # relu3: fc1's epilogue
    assert t["plan_bytes"] == conv1 + relu1 + pool1 + conv2 + relu2 + pool2 + fc1 + fc2
    weights = 4 * 49 + 4 + 16 * 4 * 49 + 16 + 32 * 1024 + 32 + 10 * 32 + 10
    assert t["network_bytes"] == e * (86 * 86 + 10 + weights) and t["host_bytes"] == e * (86 * 86 + 10)
    assert t["flops"] == LENET.conv_shape(LENET.layer("conv1"), 1).flops + LENET.conv_shape(LENET.layer("conv2"), 1).flops + 2 * (1024 * 32 + 32 * 10)
    per_image = t["plan_bytes"] - e * weights  # weights once per pass, activations per image
    assert report.network_traffic(LENET, 10, {})["plan_bytes"] == e * weights + 10 * per_image


def test_conv_check_and_indices():
    ref = np.arange(1.0, 9.0).reshape(2, 1, 2, 2)
    assert check_output(ref.astype(np.float32), ref, 1e-5).status == "ok"
    assert check_output(ref.astype(np.float32) + 1, ref, 1e-5).error.startswith("max relative error")
    poisoned = ref.astype(np.float32)
    poisoned[1, 0, 1, 1] = np.nan
    assert "NaN" in check_output(poisoned, ref, 1e-5).error
    assert "NaN" in check_output(ref, ref, 1e-5, all_written=False).error
    assert list(check_indices(100, 3)) == [0, 1, 2, 97, 98, 99]
    assert list(check_indices(4, 8)) == [0, 1, 2, 3]
    assert loosest_precision(["fp32", "fp16", "tf32"]) == "fp16"


# -- result and table from fake numbers ----------------------------------------------------------
def conv_rec(layer, variant, precision, ms, status="ok", params=None):
    shape = LENET.conv_shape(LENET.layer(layer), 10000)
    return {"layer": layer, "variant": variant, "params": params or {}, "resolved_params": params or {},
            "precision": precision, "tolerance": 1e-5, "fused": [], "status": status,
            "error": None if status == "ok" else "max relative error 1 exceeds the 1e-05 tolerance",
            "max_rel_err": 1e-7, "samples_ms": [ms * 1.1, ms, ms * 0.95], "bytes": shape.min_bytes, "flops": shape.flops}


def fake_measurements(cudnn=True, batch=10000, harness=True):
    traffic = report.network_traffic(LENET, batch, {})
    meas = {"config": "bench/default.yaml", "batch": batch, "repeats": 3, "warmup": 1, "seed": 0, "device": "NVIDIA H100 80GB HBM3",
            "environment": {"gpu": "NVIDIA H100 80GB HBM3"},
            "ceilings": {"copy_bytes": 1 << 30, "copy_samples_ms": [0.72, 0.7182, 0.73],
                         "h2d_bytes": 256 << 20, "h2d_samples_ms": [5.0, 5.0, 5.1], "d2h_samples_ms": [4.0, 4.1, 4.0],
                         "matmul_TFLOPps": {"fp32": 50.0, "tf32": 400.0, "fp16": 700.0}},
            "convs": [conv_rec("conv1", "register_tiled_gemm", "fp32", 0.9, params={"BLOCK_M": 4}),
                      conv_rec("conv1", "restrict_unroll", "fp32", 0.3, status="incorrect"),  # fastest, but wrong
                      conv_rec("conv1", "wmma_8x32x16", "fp16", 0.5),
                      conv_rec("conv2", "register_tiled_gemm", "fp32", 1.2),
                      conv_rec("conv2", "fp16", "fp16", 0.45)],
            "forward": {"variant": "conv1:wmma_8x32x16+conv2:fp16", "precision": "fp16", "status": "ok", "error": None,
                        "samples_ms": [2.0, 2.0, 2.2], **traffic},
            "end_to_end": [{"variant": "conv1:wmma_8x32x16+conv2:fp16", "precision": "fp16", "streams": 4, "status": "ok",
                            "error": None, "samples_ms": [7.5, 7.0, 7.9], "input_format": "fp32", "batch": batch,
                            "tail_images": batch // 8, **traffic}]}
    if cudnn:
        def per_mode(f32, t32, f16):
            return {"fp32": {"samples_ms": [f32]}, "tf32": {"samples_ms": [t32]}, "fp16": {"samples_ms": [f16]}}

        meas["cudnn"] = {"available": True, "note": None, "layers": {"conv1": per_mode(7.79, 7.0, 4.47), "conv2": per_mode(5.8, 2.62, 1.01)},
                         "forward": per_mode(15.9, 10.0, 6.0)}
    else:
        meas["cudnn"] = {"available": False, "note": "n/a (PyTorch not installed)"}
    if harness:
        meas["harness"] = {"events": {"job_id": "j", "variant": "x", "runs": [{"status": "ok", "error": None, "total_s": 3.1},
                                                                             {"status": "ok", "error": None, "total_s": 1.5}]},
                           "nsys": {"status": "skipped", "note": "nsys not found (PATH or $NSYS)"}}
    return meas


def test_what_pytorch_would_run_instead_beside_our_forward():
    """Eager is cuDNN's forward row; a CUDA graph and torch.compile are measured rows of their own,
    a failed one keeps its error. ours/that: our forward's median (2.0 ms) over theirs."""
    meas = fake_measurements()
    meas["instead"] = {"available": True, "note": None, "rows": [
        {"way": "CUDA graph", "mode": "fp16", "status": "ok", "error": None, "samples_ms": [5.0, 5.1, 4.9],
         "max_rel_err": 2e-3, "prepare_s": 0.4},
        {"way": "torch.compile max-autotune", "mode": "fp16", "status": "failed", "samples_ms": [],
         "error": "BackendCompilerFailed: no C compiler", "max_rel_err": None, "prepare_s": None}]}
    result = report.build_result(meas, {"batch": 10000, "ms": {}})
    rows = {(r["way"], r["mode"]): r for r in result["instead"]}
    assert list(rows) == [("eager", "fp32"), ("eager", "fp16"), ("CUDA graph", "fp16"), ("torch.compile max-autotune", "fp16")]
    assert rows["eager", "fp32"]["ours_over"] == pytest.approx(2.0 / 15.9)
    assert rows["CUDA graph", "fp16"]["ours_over"] == pytest.approx(2.0 / 5.0)
    assert rows["torch.compile max-autotune", "fp16"]["ours_over"] is None
    text = report.format_report(result)
    # the bench's inputs are fixed, and it says so above its table: its rows are not what ranks a kernel
    assert text.splitlines()[1].startswith("inputs: NOT fresh.")
    table = text.split("What PyTorch would run instead", 1)[1]
    assert "| CUDA graph " in table and "fp16 channels_last" in table and "0.40" in table
    assert "failed: BackendCompilerFailed: no C compiler" in table
    assert "| tf32" not in table  # eager at the modes the other ways run only

    meas["instead"] = {"available": False, "note": "n/a (PyTorch failed: OutOfMemoryError)", "rows": []}
    text = report.format_report(report.build_result(meas, {"batch": 10000, "ms": {}}))
    assert text.endswith("- PyTorch instead (CUDA graph, torch.compile): n/a (PyTorch failed: OutOfMemoryError)")


# Round one's targets, which these fake numbers sit either side of (bench/default.yaml now has round two's).
ROUND_ONE = {"batch": 10000, "device": "H100",
             "ms": {"conv1": 0.6, "conv2": {"fp32": 0.8, "tf32": 0.8, "fp16": 0.5}, "forward": 1.0, "end_to_end": 8.0,
                    "harness_events": 2000, "harness_nsys": 5000}}


def test_result_rows_best_floors_ratios_and_verdicts(tmp_path):
    targets = ROUND_ONE
    result = report.build_result(fake_measurements(), targets)
    assert result["ceilings"]["dtod_GBps"] == pytest.approx(2 * (1 << 30) / 0.72e-3 * 1e-9)
    assert result["best"]["conv1"]["variant"] == "wmma_8x32x16"  # the faster restrict_unroll is incorrect
    assert result["best"]["conv2"]["variant"] == "fp16"
    rows = {(r["label"], r.get("variant")): r for r in result["rows"]}
    wrong = rows[("conv1", "restrict_unroll")]
    assert wrong["best"] is False and wrong["met"] is False  # a wrong result never meets a target
    wmma = rows[("conv1", "wmma_8x32x16")]
    rate = 2 * (1 << 30) / 0.72e-3
    assert wmma["median_ms"] == 0.5 and wmma["min_ms"] == pytest.approx(0.475)
    assert wmma["spread"] == pytest.approx(0.05)  # samples 0.55, 0.5, 0.475: deviations 0.05, 0, 0.025
    assert wmma["floor_ms"] == pytest.approx(wmma["bytes"] / rate * 1e3)
    assert wmma["x_floor"] == pytest.approx(0.5 / wmma["floor_ms"])
    assert wmma["GBps"] == pytest.approx(wmma["bytes"] / 0.5e-3 / 1e9)
    assert wmma["GFLOPps"] == pytest.approx(wmma["flops"] / 0.5e-3 / 1e9)
    assert wmma["cudnn_mode"] == "fp16" and wmma["ours_over_cudnn"] == pytest.approx(0.5 / 4.47)
    assert wmma["target_ms"] == 0.6 and wmma["met"] is True
    c2 = rows[("conv2", "register_tiled_gemm")]
    assert c2["target_ms"] == 0.8 and c2["met"] is False and c2["ours_over_cudnn"] == pytest.approx(1.2 / 5.8)
    assert rows[("conv2", "fp16")]["target_ms"] == 0.5 and rows[("conv2", "fp16")]["met"] is True
    fwd = rows[("forward", "conv1:wmma_8x32x16+conv2:fp16")]
    assert fwd["met"] is False and fwd["ours_over_cudnn"] == pytest.approx(2.0 / 6.0)
    assert fwd["floor_ms"] == pytest.approx(fwd["plan_bytes"] / rate * 1e3) and fwd["network_floor_ms"] < fwd["floor_ms"]
    e2e = rows[("end_to_end", "conv1:wmma_8x32x16+conv2:fp16")]
    # The pipeline's floor: the longest stage (the input up, at 256 MiB per 5 ms), plus an eighth (the
    # smallest chunk) of the others: the compute (the forward row's floor) and the logits down (4 ms a 256 MiB).
    up, down = e2e["shipped_bytes"] / ((256 << 20) / 5.0e-3) * 1e3, e2e["logits_bytes"] / ((256 << 20) / 4.0e-3) * 1e3
    assert e2e["floor_ms"] == pytest.approx(up + (fwd["floor_ms"] + down) / 8) and up > fwd["floor_ms"]
    assert e2e["met"] is True and e2e["target_ms"] == 8.0
    events = next(r for r in result["rows"] if r["label"] == "harness_events")
    assert events["median_ms"] == pytest.approx(1500) and events["target_ms"] == 2000 and events["met"] is True
    assert events["spread"] is None  # one sample: the cached job's total
    nsys = next(r for r in result["rows"] if r["label"] == "harness_nsys")
    assert nsys["status"] == "skipped" and nsys["met"] is None and "nsys not found" in nsys["error"]

    out = tmp_path / "bench.json"
    write_json_atomic(out, result)  # no NaN, nothing unserializable
    assert json.loads(out.read_text())["rows"][0]["samples_ms"] == result["rows"][0]["samples_ms"]

    text = report.format_report(result)
    lines = text.splitlines()
    assert any(line.startswith("| conv1 best") and "wmma_8x32x16" in line and "| yes" in line for line in lines)
    # ms and ±% of the forward (samples 2.0, 2.0, 2.2: MAD 0) and end-to-end rows (7.5, 7.0, 7.9: MAD 0.4 of 7.5)
    ms_and_spread = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[4:6]] for line in lines
                     if line.startswith(("| forward", "| end to end"))}
    assert ms_and_spread == {"forward (on device)": ["2.000", "0.0"], "end to end fp32 (4 streams)": ["7.500", "5.3"]}
    header = next(line for line in lines if line.startswith("| row"))
    for column in report.TABLE_HEADERS:
        assert column in header
    assert "0.11 (fp16)" in text  # ours / cuDNN fp16 of conv1 best
    assert "harness nsys (cached job)" in text and "skipped" in text
    assert "matmul ceilings" in text and "GFLOP = " in text
    assert "not judged" not in text and "targets are for the H100" not in text


def test_without_pytorch_and_off_target_batch_the_table_says_so():
    targets = bench.load_bench_config("bench/default.yaml").targets
    meas = fake_measurements(cudnn=False, batch=256, harness=False)
    meas["device"] = "NVIDIA H200"
    result = report.build_result(meas, targets)
    assert all(r["met"] is None for r in result["rows"])
    assert all(r.get("ours_over_cudnn") is None for r in result["rows"])
    text = report.format_report(result)
    assert "n/a (PyTorch not installed)" in text
    assert "targets are for batch 10000: not judged at batch 256" in text
    assert "targets are for the H100; this ran on NVIDIA H200" in text
    conv_lines = [line for line in text.splitlines() if line.startswith("| conv")]
    assert conv_lines and all("n/a (PyTorch not installed)" in line for line in conv_lines)


def test_the_best_names_the_candidates_its_samples_cannot_tell_from_it():
    def sampled(variant, ms, seed):
        rec = conv_rec("conv1", variant, "fp32", ms)
        rec["samples_ms"] = list(ms * (1 + 0.01 * np.random.default_rng(seed).standard_normal(12)))
        return rec

    meas = fake_measurements(cudnn=False, harness=False)
    meas["convs"] = [sampled("naive", 1.0, 1), sampled("tiled", 1.002, 2), sampled("fused", 1.2, 3),
                     {**sampled("wrong", 0.9, 4), "status": "incorrect"}] + [c for c in meas["convs"] if c["layer"] == "conv2"]
    result = report.build_result(meas, {})
    best = result["best"]["conv1"]
    tied = {r["variant"] for r in result["rows"] if r.get("tied")}
    assert best["variant"] in ("naive", "tiled") and tied == {"naive", "tiled"} - {best["variant"]}
    assert [t["variant"] for t in best["tied"]] == sorted(tied)  # fused is 20% slower; the wrong one never counts
    labels = [row[0] for row in report.table_rows(result)]
    assert labels[:3] == ["conv1 best", "conv1 tied", "conv1"]


def test_a_layer_without_a_correct_candidate_has_no_best():
    meas = fake_measurements(harness=False)
    meas["convs"] = [c if c["layer"] == "conv1" else {**c, "status": "failed", "error": "boom", "samples_ms": []}
                     for c in meas["convs"]]
    result = report.build_result(meas, {"batch": 10000, "ms": {}})
    assert result["best"]["conv2"] is None
    assert "no correct candidate" in report.format_report(result)


# -- the whole bench over a fake GPU -------------------------------------------------------------


def no_torch():
    return None, "n/a (PyTorch not installed)"


def test_whole_bench_over_a_fake_gpu(tmp_path):
    text = GOOD.replace("    - restrict_unroll", "    - restrict_unroll\n    - naive\n    - wmma_8x32x16")
    config = bench.load_bench_config(write(tmp_path, text))
    result = bench.run_bench(config, bench.BenchOptions(batch=24, repeats=3), FAKE, load_torch=no_torch)
    convs = {r["variant"]: r for r in result["rows"] if r["label"] == "conv1"}
    assert convs["register_tiled_gemm"]["status"] == "ok" and convs["register_tiled_gemm"]["max_rel_err"] < 1e-5
    assert convs["restrict_unroll"]["status"] == "incorrect" and "tolerance" in convs["restrict_unroll"]["error"]
    assert convs["naive"]["status"] == "incorrect" and "NaN" in convs["naive"]["error"]  # poisoned, never written
    assert all(r["median_ms"] == 0.25 for r in convs.values())  # one fake clock tick between each event pair
    assert result["best"]["conv1"]["variant"] in ("register_tiled_gemm", "wmma_8x32x16")
    assert result["best"]["conv2"]["variant"] in ("register_tiled_gemm", "fp16")
    for kind in ("forward", "end_to_end"):
        row = next(r for r in result["rows"] if r["kind"] == kind)
        assert row["status"] == "ok", row["error"]
        assert row["median_ms"] > 0 and row["accuracy"] > 0.8 and row["floor_ms"] > 0
    e2e = next(r for r in result["rows"] if r["kind"] == "end_to_end")
    assert e2e["streams"] == 4 and e2e["chunks"] == len(pass_chunks(24, 4)) > 4  # several chunks per stream, as jobs cut them
    assert e2e["graph"] and e2e["batch"] == 24 and "end_to_end_small" not in {r["label"] for r in result["rows"]}
    ceilings = result["ceilings"]
    assert ceilings["copy_bytes"] == 1 << 20 and ceilings["dtod_GBps"] > 0 and ceilings["h2d_GBps"] > 0
    assert result["cudnn"]["note"] == "n/a (PyTorch not installed)"
    write_json_atomic(tmp_path / "r.json", result)
    assert "| conv1 best" in report.format_report(result)


@pytest.mark.parametrize("graph", [True, False])
def test_end_to_end_rows_replay_a_captured_pass_or_enqueue_each(tmp_path, graph):
    """With graph, one capture per end-to-end row and every pass a replay of it (the fake capture, like
    a real one, runs nothing: logits only a replay wrote pass the check); the small batch is a row of
    its own, judged against its own target."""
    text = GOOD.replace("copy_mib: 1", f"copy_mib: 1\nend_to_end: {{graph: {str(graph).lower()}, "
                                       "small_batch: {batch: 5, chunk_images: 2}}")
    text = text.replace("end_to_end: 8.0,", "end_to_end: 8.0, end_to_end_small: 0.1,")
    config = bench.load_bench_config(write(tmp_path, text))
    before = FakeGpu.captures
    result = bench.run_bench(config, bench.BenchOptions(batch=24, repeats=3), FAKE, load_torch=no_torch)
    assert FakeGpu.captures - before == (2 if graph else 0)
    rows = {r["label"]: r for r in result["rows"] if r["kind"] == "end_to_end"}
    assert set(rows) == {"end_to_end", "end_to_end_small"}
    small = rows["end_to_end_small"]
    assert small["status"] == "ok", small["error"]
    assert (small["batch"], small["chunks"], small["chunk_images"], small["graph"]) == (5, 3, 2, graph)
    assert small["accuracy"] is not None and small["target_ms"] == 0.1
    assert small["host_bytes"] < rows["end_to_end"]["host_bytes"]  # its floor is its own batch's
    printed = report.format_report(result)
    assert f"| end to end fp32, batch 5 (4 streams, 3 x 2 images{', CUDA graph' if graph else ''}) |" in printed


@pytest.mark.parametrize("streams, memory", [(1, "pageable"), (4, "pinned")])
def test_jobs_pipeline_over_a_fake_gpu(streams, memory):
    """job._measure_gpu after its pass moved to runner.pipeline_pass: the same samples as before."""
    from convsweep.sweep.config import RunSpec
    from convsweep.measure.settings import measure

    spec = RunSpec(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                   variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}}, batch=40,
                   streams=streams, host_memory=memory, repeats=2, warmup=1, profiler="events")
    result = measure(spec, backend=FAKE)
    assert result.status == "ok", result.error
    metrics = sorted({s.metric for s in result.samples})
    if streams == 1:  # one chunk, one stream: copies, compute and per-layer op times are measurable
        assert metrics == ["compute_ms", "d2h_ms", "forward_ms", "h2d_ms", "op_time_ms"]
        t = result.timings
        assert t.forward_ms == pytest.approx(t.h2d_ms + t.compute_ms + t.d2h_ms)
    else:
        assert metrics == ["forward_ms"]
    assert len([s for s in result.samples if s.metric == "forward_ms"]) == 2


def test_bench_cli_with_a_bad_file_is_one_line(tmp_path):
    path = write(tmp_path, GOOD.replace("- restrict_unroll", "- {variant: nope}"))
    proc = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "bench", "--config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"convsweep: {path}: candidates.conv1[1].variant: unknown variant")


def test_bench_help():
    proc = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "bench", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for flag in ("--config", "--batch", "--repeats", "--json", "--harness"):
        assert flag in proc.stdout


def test_harness_runs_real_jobs_through_the_cli(tmp_path):
    """The plumbing of --harness with the CPU reference variant: two fresh run-job processes."""
    config = bench.load_bench_config(write(tmp_path, GOOD))
    best = {"conv1": {"variant": "reference", "resolved_params": {}}, "conv2": {"variant": "reference", "resolved_params": {}}}
    out = run_harness(config, best, batch=40, profilers=("events",))
    runs = out["events"]["runs"]
    assert len(runs) == 2 and all(r["status"] == "ok" and r["total_s"] > 0 and r["wall_s"] > 0 for r in runs), runs
    result = report.build_result({**fake_measurements(harness=False), "harness": out}, {"batch": 40, "ms": {}})
    assert next(r for r in result["rows"] if r["kind"] == "harness")["median_ms"] == pytest.approx(runs[-1]["total_s"] * 1e3)


# -- PyTorch pieces that run on the CPU ----------------------------------------------------------
def test_torch_network_matches_the_reference():
    torch = pytest.importorskip("torch")
    from convsweep.model.network import load_weights

    weights = load_weights(LENET)
    x = np.random.default_rng(0).random((3, 1, 86, 86), dtype=np.float32)
    forward = cudnn.torch_network(torch, LENET, {k: torch.from_numpy(v) for k, v in weights.items()}, torch.from_numpy(x))
    ref = reference_forward(LENET, weights, x.astype(np.float64))
    assert normwise_error(forward().numpy(), ref) < 1e-5


def test_torch_mode_sets_and_restores_the_flags():
    torch = pytest.importorskip("torch")
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    with cudnn.torch_mode(torch, "tf32", True):
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.benchmark
    with cudnn.torch_mode(torch, "fp32", False):
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark) == before


# -- on a real GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
def test_bench_on_the_gpu(tmp_path, monkeypatch):
    from convsweep.bench import instead

    monkeypatch.setattr(instead, "WAYS", instead.WAYS[:1])  # the CUDA graph; torch.compile has a test of its own
    config = bench.load_bench_config("bench/default.yaml")
    result = bench.run_bench(config, bench.BenchOptions(batch=256, repeats=3))
    write_json_atomic(tmp_path / "bench.json", result)
    print(report.format_report(result))
    timed = [r for r in result["rows"] if r["kind"] in ("conv", "forward", "end_to_end")]
    # + the forward of the best per layer and one per whole-network variant; end to end in each input format at
    # the bench batch and, where the file asks, at the small batch
    forwards = 1 + len(config.networks)
    ends = len(config.end_to_end["inputs"]) * (1 + bool(config.end_to_end.get("small_batch")))  # per input format
    assert len(timed) == sum(len(c) for c in config.candidates.values()) + forwards + ends
    for row in timed:
        assert row["status"] == "ok", (row["label"], row.get("variant"), row["error"])
        assert row["median_ms"] > 0 and all(s > 0 for s in row["samples_ms"]) and len(row["samples_ms"]) == 3
        assert row["GBps"] > 0 and row["floor_ms"] > 0
    assert 100 < result["ceilings"]["dtod_GBps"] < 20000 and result["ceilings"]["h2d_GBps"] > 1
    cudnn = result["cudnn"]
    if cudnn["available"]:
        for layer in ("conv1", "conv2"):
            for mode in bench.CUDNN_MODES:
                entry = cudnn["layers"][layer][mode]
                assert entry["samples_ms"] and min(entry["samples_ms"]) > 0, entry
                assert entry["max_rel_err"] < {"fp32": 1e-5, "tf32": 1e-2, "fp16": 1e-2}[mode]
        graphs = [r for r in result["instead"] if r["way"] == instead.CUDA_GRAPH]
        assert [r["mode"] for r in graphs] == list(instead.INSTEAD_MODES)
        for row in graphs:
            assert row["status"] == "ok", row["error"]
            assert row["median_ms"] > 0 and row["ours_over"] > 0 and row["prepare_s"] > 0
            assert row["max_rel_err"] < {"fp32": 1e-5, "fp16": 1e-2}[row["mode"]]
    else:
        assert cudnn["note"].startswith("n/a")


@pytest.mark.gpu
def test_torch_compile_max_autotune_runs_the_network_correctly(monkeypatch):
    """The slow way (Inductor compiles and autotunes every kernel), once, in fp16 at a small batch."""
    from convsweep.bench import instead
    from convsweep.bench.cudnn import torch_cuda
    from convsweep.bench.measure import Timing
    from convsweep.inputs.batch import load_batch

    torch, why = torch_cuda()
    if torch is None:
        pytest.skip(why)
    monkeypatch.setattr(instead, "WAYS", instead.WAYS[1:])
    monkeypatch.setattr(instead, "INSTEAD_MODES", ("fp16",))
    config = bench.load_bench_config("bench/default.yaml")
    timing = Timing(64, 1, 3, None)
    (row,) = instead.measure_instead(torch, timing, config, load_batch(config.network, config.dataset, 64))["rows"]
    assert row["way"] == instead.TORCH_COMPILE and row["status"] == "ok", row["error"]
    assert len(row["samples_ms"]) == 3 and row["max_rel_err"] < 1e-2 and row["prepare_s"] > 0


@pytest.mark.gpu
def test_bench_harness_on_the_gpu():
    config = bench.load_bench_config("bench/default.yaml")
    best = {c.layer: {"variant": c.variant, "resolved_params": c.resolved}
            for c in (config.candidates["conv1"][0], config.candidates["conv2"][0])}
    out = run_harness(config, best, batch=256, profilers=("events",))
    cached = out["events"]["runs"][-1]
    assert cached["status"] == "ok", cached["error"]
    assert all(cached["cache_hits"]) and cached["total_s"] > 0


def test_a_whole_network_variant_is_a_forward_row_of_its_own(tmp_path):
    """`networks:` candidates run as forward plans beside the best of each layer; end to end runs
    the fastest correct one (on the fake clock every forward ties, so the first: the per-layer plan)."""
    text = GOOD + "networks:\n  - {variant: fp16_fused_network, params: {BLOCKS: 132}}\n"
    config = bench.load_bench_config(write(tmp_path, text))
    assert [(c.layer, c.variant, c.resolved) for c in config.networks] == [("conv1", "fp16_fused_network", {"BLOCKS": 132})]
    result = bench.run_bench(config, bench.BenchOptions(batch=24, repeats=3), FAKE, load_torch=no_torch)
    forwards = [r for r in result["rows"] if r["kind"] == "forward"]
    assert len(forwards) == 2 and all(r["status"] == "ok" for r in forwards)
    assert forwards[1]["variants"] == {"conv1": "fp16_fused_network"} and forwards[1]["precision"] == "fp16"
    # the fused row's floor: one kernel reads the images and weights and writes the logits
    assert forwards[1]["plan_bytes"] == forwards[1]["network_bytes"] < forwards[0]["plan_bytes"]
    labels = [row[0] for row in report.table_rows(result)]
    assert labels.count("forward (on device)") == 2
    assert next(r for r in result["rows"] if r["kind"] == "end_to_end")["variants"] == forwards[0]["variants"]


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("    - restrict_unroll", "    - fp16_fused_network"),
     "candidates.conv1[1].variant: 'fp16_fused_network' runs the whole network: list it under networks"),
    (lambda t: t + "networks: [naive]\n",
     "networks[0].variant: 'naive' computes one conv layer: list it under candidates"),
])
def test_per_layer_and_whole_network_candidates_are_kept_apart(tmp_path, edit, message):
    with pytest.raises(ConfigError) as info:
        bench.load_bench_config(write(tmp_path, edit(GOOD)))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_end_to_end_has_a_row_per_input_format_each_with_its_floor_and_target(tmp_path):
    """end_to_end.inputs: the pipeline once per format, each shipping its own bytes (u8-source: the
    stored 28x28 digits), checked against float64 of what it shipped, judged against its format's target."""
    text = GOOD.replace("copy_mib: 1", "copy_mib: 1\nend_to_end: {inputs: [fp32, u8, u8-source]}")
    text = text.replace("end_to_end: 8.0,", "end_to_end: {fp32: 1000000, u8-source: 0.001},")  # the fake GPU is slow
    config = bench.load_bench_config(write(tmp_path, text))
    result = bench.run_bench(config, bench.BenchOptions(batch=64, repeats=3), FAKE, load_torch=no_torch)
    rows = {r["input_format"]: r for r in result["rows"] if r["kind"] == "end_to_end"}
    assert list(rows) == ["fp32", "u8", "u8-source"]
    assert all(r["status"] == "ok" for r in rows.values()), [r["error"] for r in rows.values()]
    assert [rows[f]["shipped_bytes"] for f in rows] == [64 * 86 * 86 * 4, 64 * 86 * 86, 64 * 28 * 28]
    assert rows["fp32"]["met"] is True and rows["u8-source"]["met"] is False and rows["u8"]["target_ms"] is None
    assert all(r["floor_ms"] > 0 and r["x_floor"] == pytest.approx(r["median_ms"] / r["floor_ms"]) for r in rows.values())
    printed = report.format_report(result)
    assert "| end to end u8-source (4 streams" in printed and "| end to end fp32 (4 streams" in printed


@pytest.mark.parametrize("change, message", [
    ("end_to_end: {inputs: [fp32, bf16]}", "end_to_end.inputs[1]: expected one of fp32, fp16, u8, u8-source, got 'bf16'"),
    ("dataset: random\nend_to_end: {inputs: [u8-source]}",
     "end_to_end.inputs[0]: input u8-source ships a dataset's stored images, upscaled on the GPU; dataset random has none"),
])
def test_an_input_format_the_bench_cannot_time_is_one_line(tmp_path, change, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        bench.load_bench_config(write(tmp_path, GOOD.replace("copy_mib: 1", f"copy_mib: 1\n{change}")))


def test_a_target_for_an_unknown_input_format_is_one_line(tmp_path):
    text = GOOD.replace("end_to_end: 8.0,", "end_to_end: {fp32: 8.0, fp8: 1.0},")
    with pytest.raises(ConfigError, match=re.escape("targets.ms.end_to_end.fp8: expected an input format")):
        bench.load_bench_config(write(tmp_path, text))


def test_ceilings_only_measures_the_rates_and_prints_them_alone(tmp_path):
    config = bench.load_bench_config(write(tmp_path, GOOD))
    result = bench.run_bench(config, bench.BenchOptions(ceilings_only=True, repeats=3), FAKE, load_torch=no_torch)
    assert result["rows"] == [] and result["ceilings"]["d2h_GBps"] > 0 and result["bench_id"]
    printed = report.format_report(result)
    assert printed.startswith("convsweep bench: Fake H100") and "D2H" in printed and "|" not in printed
