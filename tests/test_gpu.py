"""Kernels, the network runner and nsys on a real GPU (skipped with the reason elsewhere).

Every check uses fresh random inputs and compares against float64; outputs are poisoned with
NaN before the kernels run (conv2d does it), so an element a kernel never writes fails.
"""
import json
import os
import re
import shutil
import sqlite3

import numpy as np
import pytest

from convsweep.sweep.config import JobSpec, RunSpec
from convsweep.base.errors import ShapeError
from convsweep.model.reference import conv2d_reference, maxpool2d_reference
from convsweep.device.nsys import find_nsys
from convsweep.model.variants import ConvShape, load_registry

pytestmark = pytest.mark.gpu

SHAPES = {  # B, C, M, H, W, K, S, and the pool (window, stride) a variant fusing maxpool gets
    "lenet-conv1": (8, 1, 4, 86, 86, 7, 1, (2, 2)),
    "lenet-conv2": (8, 4, 16, 40, 40, 7, 1, (4, 4)),
    "odd-sizes": (3, 3, 5, 23, 19, 5, 1, (2, 2)),
    "c-greater-than-m-k3-stride2": (2, 8, 2, 17, 17, 3, 2, (3, 2)),
    "batch-1-k5": (1, 2, 3, 12, 12, 5, 1, (5, 1)),
    "even-c-m8-k5": (3, 6, 8, 21, 19, 5, 1, (2, 2)),  # inside the sliding-window constraints: 3 channel pairs
    "odd-c-m8-k6": (2, 3, 8, 20, 22, 6, 1, (2, 2)),  # fp16_sliding_window's m16n8k8 path (no channel or row pairs)
}
REGISTRY = load_registry()
CASES = [(name, params) for name, var in REGISTRY.items() if not var.is_cpu and not var.fuses_tail
         for params in var.all_combinations()]  # fused networks run whole networks (test_fused_network_*)
DOUBLE_CASES = [name for name, var in REGISTRY.items() if "float64" in var.dtypes and not var.is_cpu]


@pytest.fixture(scope="module")
def gpu():
    from convsweep.device.gpu import Gpu

    with Gpu() as g:
        yield g


def test_the_driver_counts_the_gpus_and_a_gpu_past_them_is_the_machines_failure():
    from convsweep.base.errors import MachineError
    from convsweep.device.gpu import Gpu, count_devices

    count = count_devices()
    assert count >= 1
    with pytest.raises(MachineError, match=rf"^cannot open CUDA device {count} \(.+\)$"):
        Gpu(count)


def normwise_error(y, ref):
    return float(np.max(np.abs(y.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def check_variant(gpu, variant, params, shape, dtype):
    """Fresh random inputs, NaN-poisoned output (conv2d), compared with float64 numpy."""
    from convsweep.measure.runner import conv2d

    B, C, M, H, W, K, S, pool = shape
    var = REGISTRY[variant]
    rng = np.random.default_rng()
    x = rng.standard_normal((B, C, H, W)).astype(dtype)
    w = rng.standard_normal((M, C, K, K)).astype(dtype)
    b = rng.standard_normal(M).astype(dtype)
    pool = pool if var.fuses_pool else None
    if gpu.compute_capability < var.min_cc:
        pytest.skip(f"{variant} needs compute capability {var.min_cc}, {gpu.name} has {gpu.compute_capability}")
    try:
        var.check_shape(ConvShape(B, C, M, H, W, K, S, *(pool or (0, 0)), dtype=np.dtype(dtype).name), params)
    except ShapeError as refusal:  # a shape outside the variant's constraints must be refused, never computed
        with pytest.raises(ShapeError, match=re.escape(str(refusal))):
            conv2d(x, w, b, stride=S, variant=variant, params=params, gpu=gpu, pool=pool)
        return 0.0
    y = conv2d(x, w, b, stride=S, variant=variant, params=params, gpu=gpu, pool=pool)
    ref = conv2d_reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), S)
    if "relu" in var.fuses:
        ref = np.maximum(ref, 0.0)
    if var.fuses_pool:
        ref = maxpool2d_reference(ref, *pool)
    assert y.shape == ref.shape and y.dtype == dtype
    assert np.isfinite(y).all(), "unwritten (poisoned) outputs"
    return normwise_error(y, ref)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("variant, params", CASES, ids=lambda v: str(v))
def test_conv_variant_matches_float64(gpu, variant, params, shape):
    assert check_variant(gpu, variant, params, shape, np.float32) <= REGISTRY[variant].tolerance


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("variant", DOUBLE_CASES)
def test_float64_variant_matches_float64(gpu, variant, shape):
    assert check_variant(gpu, variant, REGISTRY[variant].defaults(), shape, np.float64) <= 1e-12


def test_unsupported_shape_is_refused(gpu):
    from convsweep.measure.runner import conv2d

    with pytest.raises(ShapeError, match="larger than"):
        conv2d(np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 1, 7, 7), np.float32), np.zeros(1, np.float32), gpu=gpu)


@pytest.mark.parametrize("dtype, B, n_in, n_out, relu", [
    (np.float32, 13, 1000, 3, False),  # a partial tile of images and of outputs, in not a multiple of the k tile
    (np.float32, 10000, 1024, 32, True),  # LeNet-86's fc1, with relu3 fused
    (np.float32, 10000, 32, 10, False),  # LeNet-86's fc2
    (np.float32, 5, 31, 300, True),  # several output tiles
    (np.float64, 37, 4000, 10, False),  # fp64_stride5's fc1
    (np.float64, 3, 7000, 40, True),  # two output tiles, in past the last full pair of k slices
])
def test_dense_matches_float64(gpu, dtype, B, n_in, n_out, relu):
    from types import SimpleNamespace

    from convsweep.device.compile import LAYERS_SOURCE, compile_source
    from convsweep.model.layers import LAYER_KINDS, Layer
    from convsweep.model.network import Step

    build = compile_source(LAYERS_SOURCE, "layers", {"CONV_T": "double"} if dtype == np.float64 else {}, gpu.arch)
    rng = np.random.default_rng()
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((B, n_in), (n_out, n_in), n_out))
    stream = gpu.stream()
    dx, dw, db = (gpu.to_device(a, stream) for a in (x, w, b))
    dy = gpu.alloc((B, n_out), dtype)
    gpu.fill(dy, 0xFF, stream)
    dense = Layer("fc", "dense", (n_in,), (n_out,), out_features=n_out)
    step = Step(dense, (Layer("relu", "relu", (n_out,), (n_out,)),) if relu else ())
    runner = SimpleNamespace(gpu=gpu, layer_kernels={"dense": gpu.kernel(gpu.module(build), "dense")},
                             weights={"fc.weight": dw, "fc.bias": db})
    LAYER_KINDS["dense"].enqueue(runner, stream, step, dx, dy, None)
    y = np.empty((B, n_out), dtype)
    gpu.download(dy, y, stream)
    stream.sync()
    assert np.isfinite(y).all(), "unwritten (poisoned) outputs"
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    if relu:
        ref = np.maximum(ref, 0.0)
        assert (y == 0).any() and (y > 0).any()
    assert normwise_error(y, ref) <= (1e-5 if dtype == np.float32 else 1e-12)


SWEEP = {"experiment": "gpu-test", "config_hash": "h", "config_path": "x"}


def spec(profiler: str, **over) -> RunSpec:
    base = dict(experiment="gpu-test", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}},
                batch=512, streams=1, host_memory="pageable", repeats=3, warmup=1, profiler=profiler)
    base.update(over)
    return RunSpec(**base)


def run_job(run: RunSpec, out):
    """`run` as a lone job; its one measurement (a convsweep.measure.record.Measurement)."""
    from convsweep.measure.job import run_job as run_one_job

    result = run_one_job(JobSpec.for_run(run, SWEEP), out)
    assert len(result.measurements) == 1
    return result.measurements[0]


def reference_accuracy(batch: int) -> float:
    from convsweep.inputs.data import batch_indices, load_dataset
    from convsweep.model.network import load_network, load_weights, reference_forward
    from convsweep.sweep.config import ROOT

    net = load_network(ROOT / "networks/lenet86.yaml")
    data = load_dataset("mnist5k", image_size=net.input_shape[-1])
    idx = batch_indices(len(data.labels), batch)
    logits = reference_forward(net, load_weights(net), data.images[idx].astype(np.float64), dtype=np.float64)
    return float(np.mean(np.argmax(logits, 1) == data.labels[idx]))


def test_network_on_gpu_with_events(tmp_path):
    result = run_job(spec("events"), tmp_path / "r.json")
    assert result.status == "ok", result.error
    assert result.profiler == "events"
    assert result.accuracy == pytest.approx(reference_accuracy(512))
    t = result.timings
    assert all(t.op_time_ms[k] > 0 for k in ("conv1", "conv2"))
    assert 0 < t.h2d_ms < t.forward_ms and t.compute_ms > t.op_time_ms["conv2"]
    assert {b["variant"] for b in result.builds} == {"naive", "layers"}
    assert result.environment["gpu"] and result.environment["nvrtc"]


@pytest.mark.parametrize("profiler", ["events", "nsys"])
def test_repeats_auto_stops_by_its_rule_and_nsys_holds_every_pass(profiler, tmp_path):
    """Not yet run on the lent GPU (written when the session's device time was spent)."""
    if profiler == "nsys" and find_nsys() is None:
        pytest.skip("nsys is not installed")
    rule = {"max_noise": 0.005, "min_samples": 10, "min_time_s": 0.05, "timeout_s": 5, "max_samples": 40}
    result = run_job(spec(profiler, repeats="auto", stopping=rule), tmp_path / "r.json")
    assert result.status == "ok", result.error
    stopping = result.stopping
    assert stopping.rule == "auto" and stopping.reason in ("converged", "timeout", "max_samples")
    assert 1 <= stopping.samples <= 40 and (stopping.samples >= 10 or stopping.reason == "timeout")
    passes = {s.repeat for s in result.samples if s.metric == "op_time_ms"}
    assert passes == set(range(stopping.samples))  # under nsys: every pass the rule took is in the report


def test_energy_is_known_when_the_timed_part_spans_the_counters_steps(tmp_path):
    """30 passes of batch 10000 (tens of milliseconds each): NVML's energy counter steps several times."""
    result = run_job(spec("events", batch=10000, repeats=30), tmp_path / "r.json")
    assert result.status == "ok", result.error
    energy = result.energy
    assert energy is not None and energy["passes"] == 30
    assert 20 < energy["watts"] < 1000  # an H100 idles near 70 W and is capped at 700 W
    assert energy["joules_per_pass"] == pytest.approx(energy["watts"] * result.phases_s["timed"] / 30)


@pytest.mark.parametrize("profiler", ["events", "nsys"])
def test_a_short_timed_part_gets_its_energy_from_untimed_passes_after_it(profiler, tmp_path):
    """Five passes of batch 100 (about a millisecond each) are too short for the counter's steps."""
    if profiler == "nsys" and find_nsys() is None:
        pytest.skip("nsys is not installed")
    result = run_job(spec(profiler, batch=100, repeats=5), tmp_path / "r.json")
    assert result.status == "ok", result.error
    energy = result.energy
    assert energy is not None and energy["passes"] == 5 and energy["extra_passes"] > 0
    assert 20 < energy["watts"] < 1000 and 0 < result.phases_s["energy"] <= 0.5 + 0.1
    assert len([s for s in result.samples if s.metric == "forward_ms"]) == 5


@pytest.mark.parametrize("profiler", ["events", "nsys"])
@pytest.mark.alone  # its verdict rests on a time: no other GPU test beside it
def test_cold_cache_flushes_l2_outside_the_times_and_nvml_reads_clocks_and_energy(profiler, tmp_path):
    """Batch 100 of naive fits in L2 warm: cold writes over it before each conv layer. The flushes
    are timed apart (l2_flush_ms) and left out of the pass; NVML gives clocks, slowdowns and energy.
    Alone: beside other workers' kernels the lent H100 once timed cold's compute 0.52 ms, warm's 0.38."""
    if profiler == "nsys" and find_nsys() is None:
        pytest.skip("nsys is not installed")
    warm = run_job(spec(profiler, batch=100, repeats=20), tmp_path / "warm.json")
    cold = run_job(spec(profiler, batch=100, repeats=20, cache="cold"), tmp_path / "cold.json")
    for m in (warm, cold):
        assert m.status == "ok", m.error
        assert m.clocks_after["sm_mhz"] > 0 and m.throttle is not None
        # 20 passes of under a millisecond: too short for the energy counter's steps, most likely
        assert m.energy is None or (m.energy["passes"] == 20 and 20 < m.energy["watts"] < 1000)
    flushes = [s.value for s in cold.samples if s.metric == "l2_flush_ms"]
    assert len(flushes) == 20 and min(flushes) > 0
    assert not [s for s in warm.samples if s.metric == "l2_flush_ms"]
    # The flushes (two of 2 x 50 MB each per pass) are out of the pass's compute: reading batch 100's
    # few MB from DRAM instead of L2 costs the layers far less than the flushes take. (Not the forward
    # time: its pageable copies vary by more than a flush from run to run; the lent H100 once showed
    # warm 0.57 ms, cold 0.78 ms under nsys, and warm 0.95, cold 0.68 the next time.)
    assert cold.timings.compute_ms < warm.timings.compute_ms + 0.5 * min(flushes)
    assert cold.max_rel_err == pytest.approx(warm.max_rel_err, rel=1e-6)  # the same answer


@pytest.mark.parametrize("variants, streams", [({"conv1": "fp16_fused_network"}, 4),
                                              ({"conv1": "naive", "conv2": "naive"}, 1)])
def test_a_graph_timed_job_replays_a_correct_pass_and_times_it_whole(tmp_path, variants, streams):
    """timer graph (convsweep.base.axes): the pass captured once, each timed pass a replay whose logits are
    checked against float64 like any pass's; only the whole forward is timed, and profiler auto times
    it with events (nsys cannot split a replay into layers)."""
    graph = run_job(spec("auto", variants=variants, params={layer: {} for layer in variants}, batch=100,
                         streams=streams, host_memory="pinned", repeats=20, timer="graph"), tmp_path / "graph.json")
    assert graph.status == "ok", graph.error
    assert graph.spec["timer"] == "graph" and graph.profiler == "events" and graph.profiler_note is None
    assert {s.metric for s in graph.samples} == {"forward_ms"} and len(graph.samples) == 20
    assert graph.timings.forward_ms > 0 and all(v is None for v in graph.timings.op_time_ms.values())


@pytest.mark.skipif(find_nsys() is None, reason="nsys is not installed")
def test_job_under_nsys_reads_the_report(tmp_path):
    out = tmp_path / "job.json"
    result = run_job(spec("nsys", repeats=4), out)
    assert result.status == "ok", result.error
    assert result.profiler == "nsys"
    report, export = result.files["nsys_report"], result.files["nsys_sqlite"]
    with sqlite3.connect(export) as db:
        kernels = db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert kernels > 0 and report.endswith(".nsys-rep")
    conv = {k["layer"]: k for k in result.kernels if k["name"] == "conv_forward"}
    assert set(conv) == {"conv1", "conv2"} and all(k["launches"] == 4 for k in conv.values())
    assert {k["layer"] for k in result.kernels if k["name"] == "maxpool2d"} == {"pool1", "pool2"}
    t = result.timings
    for layer in ("conv1", "conv2"):
        assert t.op_time_ms[layer] == pytest.approx(conv[layer]["median_ms"], rel=1e-6)
    assert t.forward_ms > t.h2d_ms > 0 and t.overlap == 0.0
    assert len([s for s in result.samples if s.metric == "op_time_ms"]) == 2 * 4
    assert json.loads(out.read_text())["measurements"][0]["profiler"] == "nsys"


def takes_every_lenet_conv(var) -> bool:
    """Whether `var` accepts each LeNet-86 conv layer a network run would give it (a fused network: the
    first; it computes the rest). A one-layer variant (wgmma_conv2) runs in a network in its own test file."""
    from convsweep.sweep.config import ROOT
    from convsweep.model.network import load_network

    net = load_network(ROOT / "networks/lenet86.yaml")
    try:
        for layer in net.conv_layers[:1] if var.fuses_tail else net.conv_layers:
            var.check_shape(net.variant_shape(layer, var.fuses), var.defaults())
    except ShapeError:
        return False
    return True


@pytest.mark.parametrize("variant", [n for n, v in REGISTRY.items() if not v.is_cpu and takes_every_lenet_conv(v)])
def test_network_with_each_variant_classifies_like_the_reference(tmp_path, variant):
    """Status ok means: logits within tolerance, and fp32-class runs predict the reference's class
    on >= 99.9% of images, fp16-class runs keep the accuracy within 0.5 points (job.check_logits)."""
    result = run_job(spec("events", batch=2000, repeats=1, variants={"conv1": variant, "conv2": variant}), tmp_path / "r.json")
    assert result.status == "ok", result.error
    if REGISTRY[variant].precision != "fp16":
        assert result.prediction_agreement >= 0.999
    assert abs(result.accuracy - reference_accuracy(2000)) <= 0.005


@pytest.mark.parametrize("batch, streams, chunk", [(1, 1, None), (7, 1, None), (7, 3, 2), (10001, 1, None),
                                                   (10001, 4, 1250)])
def test_fused_network_runs_any_batch_and_any_chunking(batch, streams, chunk):
    """The whole network in one kernel: batches that are not a multiple of its 8-image groups or of
    its blocks' shares, in one pass or pipelined in chunks on several streams; logits poisoned before each pass,
    checked against float64 and the reference's accuracy; one timed layer (conv1) holds every op."""
    from convsweep.measure.settings import measure

    run = spec("events", batch=batch, repeats=2, streams=streams, host_memory="pinned" if streams > 1 else "pageable",
               chunk_images=chunk, variants={"conv1": "fp16_fused_network", "conv2": "fp16_fused_network"},
               params={"conv1": {"BLOCKS": 132}})
    result = measure(run, keep_logits=True)
    assert result.status == "ok", result.error
    assert np.isfinite(result.logits).all() and result.logits.shape == (batch, 10)
    assert result.max_rel_err <= REGISTRY["fp16_fused_network"].tolerance
    assert abs(result.accuracy - reference_accuracy(batch)) <= 0.005 + 1 / batch
    op_time = result.timings.op_time_ms
    assert list(op_time) == ["conv1"]
    if streams == 1:  # one stream's layers can be told apart by events; several streams' cannot (None)
        assert op_time["conv1"] > 0
    assert {b["variant"] for b in result.builds} == {"fp16_fused_network", "layers"}


@pytest.mark.parametrize("variants, batch, streams, chunk", [
    ({"conv1": "fp16_fused_network"}, 7, 3, 2),
    ({"conv1": "fp16_fused_network"}, 100, 4, 25),
    ({"conv1": "fp16_sliding_window", "conv2": "fp16_sliding_window"}, 301, 2, 64),
])
def test_a_captured_pass_runs_only_when_replayed_and_matches_float64(gpu, variants, batch, streams, chunk):
    """A chunked pass over several streams captured as one CUDA graph (what timing.GraphReplay
    replays): capturing runs nothing (the logits stay poisoned), each replay writes them all again,
    checked against float64."""
    from convsweep.model.checks import check_logits
    from convsweep.inputs.batch import load_batch
    from convsweep.model.network import load_network
    from convsweep.measure.runner import ConvPlan, GpuNetwork, pass_chunks, pipeline_buffers, pipeline_pass, poison_logits
    from convsweep.sweep.config import ROOT
    from convsweep.model.variants import get_variant

    network = load_network(ROOT / "networks/lenet86.yaml")
    inputs = load_batch(network, "mnist5k", batch)
    plan = ConvPlan({n: get_variant(v) for n, v in variants.items()},
                    {n: get_variant(v).resolve_params({}, n) for n, v in variants.items()})
    chunks = pass_chunks(batch, streams, chunk)
    with gpu.scope():
        lanes = [gpu.stream() for _ in range(streams)]
        net = GpuNetwork(gpu, network, inputs.weights, plan, streams, chunk)
        buffers = pipeline_buffers(gpu, network, inputs.images, "pinned", lanes[0])
        graph = gpu.capture(lanes[0], lambda: pipeline_pass(gpu, net, lanes, chunks, buffers))
        gpu.device.sync()
        assert np.isnan(buffers.logits_host).all()  # captured, not run
        for _ in range(2):
            graph.launch(lanes[0])
            lanes[0].sync()
            logits = np.array(buffers.logits_host)
            check = check_logits(logits, inputs.reference, inputs.dataset.labels, inputs.idx, plan.variants.values())
            assert check.status == "ok", check.error
            poison_logits(gpu, buffers, lanes[0])


@pytest.mark.parametrize("network, variant, batch", [
    ("networks/fp64_stride5.yaml", "naive", 1000),
    ("networks/fp64_stride5.yaml", "tiled_shared", 1000),
    ("networks/conv256.yaml", "naive", 1),
    ("networks/conv256.yaml", "register_tiled_gemm", 1),
])
def test_other_workloads_run_and_match_float64(tmp_path, network, variant, batch):
    job = spec("events", network=network, dataset="random", batch=batch, repeats=2,
               variants={"conv1": variant}, params={"conv1": {}})
    result = run_job(job, tmp_path / "r.json")
    assert result.status == "ok", result.error
    assert result.accuracy is None and result.timings.op_time_ms["conv1"] > 0
    if "fp64" in network:
        assert result.max_rel_err < 1e-12


def test_streams_with_pinned_memory_give_the_same_logits():
    from convsweep.measure.settings import measure

    one = measure(spec("events", batch=3000, repeats=1, variants={"conv1": "naive", "conv2": "naive"}), keep_logits=True)
    for streams, memory in ((4, "pinned"), (3, "registered")):
        many = measure(spec("events", batch=3000, repeats=1, streams=streams, host_memory=memory), keep_logits=True)
        assert many.status == "ok", many.error
        np.testing.assert_array_equal(many.logits, one.logits)  # same kernels, same order per image
        assert many.timings.forward_ms > 0 and many.timings.h2d_ms is None  # not measurable: null


@pytest.mark.skipif(find_nsys() is None, reason="nsys is not installed")
@pytest.mark.alone  # its verdict rests on a time: no other GPU test beside it
def test_streams_overlap_copies_with_kernels_under_nsys(tmp_path):
    # Chunks of 1000 images: each takes the GPU longer than Python takes to enqueue it, so the pass is
    # GPU-bound. (4 streams x 250-image chunks measured host-bound once: 19.5 ms > h2d + compute + d2h.)
    result = run_job(spec("nsys", batch=8000, repeats=2, streams=2, host_memory="pinned"), tmp_path / "r.json")
    assert result.status == "ok", result.error
    t = result.timings
    assert t.overlap > 0 and t.streams_used >= 2
    assert t.forward_ms < t.h2d_ms + t.compute_ms + t.d2h_ms  # overlap shortens the pass


def test_a_job_records_the_gpu_it_ran_on_and_its_clocks(tmp_path):
    result = run_job(spec("events", repeats=2), tmp_path / "r.json")
    assert result.status == "ok", result.error
    env, clocks = result.environment, result.clocks
    assert env["gpu_uuid"].startswith("GPU-") and env["driver"] and env["cuda_driver"]
    assert clocks["sm_mhz"] > 0 and clocks["memory_mhz"] > 0
    assert set(result.sources) == {"kernels/naive.cu", "kernels/layers.cu"}


@pytest.mark.alone  # its verdict rests on a time: no other GPU test beside it
def test_two_timed_jobs_on_one_gpu_take_turns(tmp_path):
    """Two `convsweep run-job` processes at once, as two Snakemake invocations would start them:
    the second waits for the first's GPU lock and its log says so."""
    import os
    import subprocess
    import sys
    import time

    job = JobSpec.for_run(spec("events", batch=4000, repeats=100), SWEEP)
    procs = []
    for name in ("first", "second"):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "convsweep", "run-job", "--spec", json.dumps({**job.to_dict(), "sweep": job.sweep}),
             "--out", str(tmp_path / f"{name}.json")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "CONVSWEEP_LOCK_DIR": str(tmp_path / "locks")}))
        time.sleep(0.2)
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert sum("waiting for GPU" in log for log in logs) == 1, logs
    results = [json.loads((tmp_path / f"{name}.json").read_text())["measurements"][0] for name in ("first", "second")]
    assert all(r["status"] == "ok" for r in results)
    waited = max(r["phases_s"]["gpu_wait"] for r in results)
    assert waited > 0.5 * min(r["phases_s"]["timed"] for r in results)


def grid_job(profiler: str) -> JobSpec:
    """naive's five BLOCK sizes as one job."""
    return JobSpec(experiment="gpu-test", network="networks/lenet86.yaml", dataset="mnist5k",
                   variants={"conv1": "naive", "conv2": "naive"},
                   grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64, 128, 256, 512, 1024]}}],
                   batch=1000, streams=1, host_memory="pageable", repeats=3, warmup=1, profiler=profiler, sweep=SWEEP)


@pytest.mark.parametrize("profiler", ["events", "nsys"])
def test_a_grid_job_measures_each_setting_as_its_own_run(tmp_path, profiler):
    """One process, one nsys session: the NVTX ranges give each setting its own kernels, launches
    and op times, and every setting computes the right answer."""
    from convsweep.measure.job import run_job as run_one_job

    if profiler == "nsys" and find_nsys() is None:
        pytest.skip("nsys is not installed")
    result = run_one_job(grid_job(profiler), tmp_path / "grid.json")
    ms = result.measurements
    assert [m.status for m in ms] == ["ok"] * 5, [m.error for m in ms]
    assert all(m.profiler == profiler for m in ms)
    blocks = [m.params["conv1"]["BLOCK"] for m in ms]
    assert blocks == [64, 128, 256, 512, 1024]
    for m, block in zip(ms, blocks):
        assert all(m.timings.op_time_ms[layer] > 0 for layer in ("conv1", "conv2"))
        if profiler == "nsys":
            conv = [k for k in m.kernels if k["name"] == "conv_forward"]
            assert {k["layer"] for k in conv} == {"conv1", "conv2"} and all(k["launches"] == 3 for k in conv)
            assert all(k["block"][0] == block for k in conv)  # this setting's kernels, no other's
            assert m.files["nsys_report"] == result.files["nsys_report"]
    assert sum(m.timings.total_s for m in ms) == pytest.approx(result.total_s)


def test_auto_arch_from_nvml_is_the_devices_own():
    """`--arch auto` asks NVML (no CUDA context beside a timed job) and gets what the device says."""
    from convsweep.device.gpu import Gpu
    from convsweep.device.provenance import host_gpu_arch

    with Gpu() as gpu:
        assert host_gpu_arch() == gpu.arch


@pytest.mark.skipif(shutil.which("ncu") is None and not os.environ.get("NCU"), reason="ncu is not installed")
def test_a_profile_job_reads_nsight_computes_metrics_for_each_conv_kernel(tmp_path):
    """Not yet run on the lent GPU (written in a session without one)."""
    from convsweep.measure.ncu import run_profile_job

    job = JobSpec.for_run(spec("events", batch=100), SWEEP)
    result = run_profile_job(job, tmp_path / "ncu" / "job.json")
    if result["status"] == "skipped" and "ERR_NVGPUCTRPERM" in (result["reason"] or ""):
        pytest.skip(f"ncu may not read this GPU's counters: {result['reason']}")
    assert result["status"] == "ok", result["reason"]
    layers = {(p["layer"], p["kernel"]) for p in result["profiles"]}
    assert layers == {("conv1", "conv_forward"), ("conv2", "conv_forward")}
    for profile in result["profiles"]:
        m = profile["metrics"]
        assert m["duration_ns"] > 0 and 0 < m["sm_pct"] <= 100 and m["registers"] > 0
        assert m["dram_read_bytes"] > 0 and m["flops"] > 0 and profile["stalls"]
        assert profile["bound"].split(":")[0] in ("memory-bound", "compute-bound", "latency")
