"""fp16_fused_network absorbing input u8-source's upsample, on a real GPU (skipped with the reason
elsewhere): its logits bit for bit those of the unfused path (layers.cu's upsample_u8 writing the fp32
input, then the same kernel reading it), whole batches and chunked ones, and a whole job pipelined over
four streams and replayed as a CUDA graph. The plan, shapes and floors are checked without a GPU in
tests/test_absorbed_input.py.
"""
import dataclasses

import numpy as np
import pytest

from convsweep.inputs.formats import FORMATS
from convsweep.model.network import load_network
from convsweep.base.paths import ROOT
from convsweep.model.variants import get_variant

from test_formats_gpu import spec
from test_gpu import normwise_error, run_job

pytestmark = pytest.mark.gpu

LENET = load_network(ROOT / "networks/lenet86.yaml")
FUSED = get_variant("fp16_fused_network")
UNFUSED = dataclasses.replace(FUSED, absorbs_input=())  # the same kernel, on upsample_u8's fp32 output


@pytest.fixture(scope="module")
def gpu():
    from convsweep.device.gpu import Gpu

    with Gpu() as g:
        yield g


@pytest.fixture(scope="module")
def mnist():
    from convsweep.inputs.data import load_dataset

    return load_dataset("mnist5k", image_size=86)


def forward(gpu, network, variant, shipped: np.ndarray, chunks: list[tuple[int, int]]):
    """(logits, the run's steps) of `network` with `variant` at conv1 on the shipped bytes: one lane,
    chunk [lo, hi) after chunk on one stream, as a pass enqueues them; the logits poisoned (0xFF
    bytes: NaN) before, so one no kernel wrote shows."""
    from convsweep.model.network import load_weights
    from convsweep.measure.runner import ConvPlan, GpuNetwork

    plan = ConvPlan({"conv1": variant}, {"conv1": variant.resolve_params({}, "conv1")})
    with gpu.scope():
        stream = gpu.stream()
        net = GpuNetwork(gpu, network, load_weights(LENET), plan, 1, max(hi - lo for lo, hi in chunks))
        x = gpu.to_device(shipped, stream)
        logits = gpu.alloc((len(shipped), 10), np.float32)
        gpu.fill(logits, 0xFF, stream)
        for lo, hi in chunks:
            net.enqueue(stream, net.lanes[0], x.rows(lo, hi), logits.rows(lo, hi), hi - lo)
        out = np.empty(logits.shape, np.float32)
        gpu.download(logits, out, stream)
        stream.sync()
    assert np.isfinite(out).all(), "logits no kernel wrote (poisoned)"
    return out, net.steps


@pytest.mark.parametrize("batch", [1, 7, 300, 10001])
def test_absorbing_the_upsample_leaves_the_logits_bit_for_bit_as_upsample_u8_then_the_kernel(gpu, mnist, batch):
    from convsweep.inputs.data import batch_indices

    fmt = FORMATS["u8-source"]
    network = fmt.network(LENET, mnist)
    idx = batch_indices(len(mnist.images), batch)  # 10001 cycles through the 5000 digits
    shipped = np.ascontiguousarray(fmt.ship(mnist)[idx])
    assert shipped.dtype == np.uint8 and shipped.shape == (batch, 1, 28, 28)

    absorbed, steps = forward(gpu, network, FUSED, shipped, [(0, batch)])
    assert [(s.layer.name, s.absorbed.name if s.absorbed else None) for s in steps] == [("conv1", "input")]
    separate, steps = forward(gpu, network, UNFUSED, shipped, [(0, batch)])
    assert [s.layer.name for s in steps] == ["input", "conv1"]
    assert np.array_equal(absorbed, separate)

    # chunks starting at images other than 0 (784 bytes apart: still 16-byte aligned), as the streams cut a batch
    if batch > 1:
        cut = batch // 3 + 1
        chunked, _ = forward(gpu, network, FUSED, shipped, [(0, cut), (cut, batch)])
        assert np.array_equal(chunked, separate)

    # and both are the network's logits, not the same garbage: within fp16's tolerance of float64
    if batch <= 300:
        from convsweep.model.network import load_weights, reference_forward

        reference = reference_forward(network, load_weights(LENET), shipped, dtype=np.float64, quiet=True)
        assert normwise_error(absorbed, reference) <= FUSED.tolerance


def test_a_u8_source_job_of_the_absorbing_fused_network_over_four_streams_as_a_graph_scores_as_fp32(tmp_path, gpu,
                                                                                                    mnist):
    """Batch 1000 cut into 16 chunks over 4 streams, each pass one replay of a captured graph; every
    pass checked against the format's float64 reference. The accuracy is exactly the unfused path's on
    the same batch, and that of the fp32 input (mnist5k's seed batch of 1000 has one image whose top two
    float64 logits are 0.001 apart: the fp16 kernels' rounding, not the absorption, would move it)."""
    from convsweep.inputs.batch import load_batch
    from convsweep.measure.settings import _floor_shape

    fused = {"conv1": "fp16_fused_network"}
    runs = {name: run_job(spec(variants=fused, params={"conv1": {}}, batch=1000, streams=4, timer="graph",
                               input_format=name), tmp_path / f"{name}.json") for name in ("fp32", "u8-source")}
    for name, m in runs.items():
        assert m.status == "ok", (name, m.error)
        assert m.integrity.fresh_passes > 0 and m.timings.forward_ms > 0
    m = runs["u8-source"]
    assert (m.spec.get("input_format"), m.spec.get("timer"), m.spec.get("streams")) == ("u8-source", "graph", 4)
    assert m.images["input_bytes"] == 1000 * 28 * 28
    (build,) = [b for b in m.builds if b["variant"] == "fp16_fused_network"]
    assert (build["params"]["SRC_H_FIXED"], build["params"]["SRC_W_FIXED"]) == (28, 28)  # the absorbing build
    network = FORMATS["u8-source"].network(LENET, mnist)
    assert m.floors["conv1"]["bytes"] == _floor_shape(network, "conv1", FUSED, 1000).min_bytes  # 784 bytes an image
    batch = load_batch(LENET, "mnist5k", 1000, "u8-source")  # the job's seed pass: its accuracy is this batch's
    separate, _ = forward(gpu, batch.network, UNFUSED, batch.images, [(0, 1000)])
    assert m.accuracy == float(np.mean(np.argmax(separate, axis=1) == batch.dataset.labels[batch.idx]))
    assert m.accuracy == runs["fp32"].accuracy
