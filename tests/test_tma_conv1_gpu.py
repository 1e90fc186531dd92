"""tma_conv1 on a Hopper GPU (skipped with the reason elsewhere): against float64 on fresh random inputs with
NaN-poisoned outputs (conv2d poisons them), at batches 1, 7 and 10001, at the odd shapes its registry
constraints allow, in every registered setting; shapes outside them refused; and LeNet-86 with it on conv1
(wgmma_conv2 on conv2) classifies like the reference, in one pass and in chunks over several streams."""
import numpy as np
import pytest

from kernel_checks import assert_job_classifies_like_the_reference, gpu_fixture, measure_like_the_reference, setting_id
from test_gpu import check_variant, spec

from convsweep.model.variants import load_registry

pytestmark = pytest.mark.gpu

NAME = "tma_conv1"
VARIANT = load_registry()[NAME]
# B, C, M, H, W, K, S, pool: LeNet-86's conv1 at two batches, then shapes that walk the kernel's edges
SHAPES = {
    "conv1-b1": (1, 1, 4, 86, 86, 7, 1, (2, 2)),
    "conv1-b7": (7, 1, 4, 86, 86, 7, 1, (2, 2)),
    "one-tile-reads-into-padding": (3, 1, 4, 20, 20, 7, 1, (2, 2)),  # 14 of 16 pixels pooled, zeros after the image
    "k5-two-tiles": (2, 1, 4, 30, 34, 5, 1, (2, 2)),  # H_pool 13 (SPLIT_H 2 refused)
    "k3-odd-h": (5, 1, 4, 17, 24, 3, 1, (2, 2)),  # the last input row never read; 22 of 32 pixels pooled
    "k1": (3, 1, 4, 28, 86, 1, 1, (2, 2)),  # one row pair a pooled row: the accumulator slot reused at once
    "wide-8-tiles": (2, 1, 4, 26, 130, 7, 1, (2, 2)),  # 8 tiles: 16 consumer warps at SPLIT_H 2
}
CASES = VARIANT.all_combinations()
gpu = gpu_fixture(VARIANT)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("params", CASES, ids=setting_id)
def test_tma_conv1_matches_float64(gpu, params, shape):
    errors = [check_variant(gpu, NAME, params, shape, np.float32) for _ in range(2)]  # fresh inputs each time
    assert max(errors) <= VARIANT.tolerance, errors


# More images than blocks: each block's ring turns over 25-76 times (every phase of both barriers); a
# float64 reference of ~15 s each
@pytest.mark.parametrize("params", [VARIANT.defaults(), {"SPLIT_H": 1, "STAGES": 4, "BLOCKS": 132}],
                         ids=["defaults", "SPLIT_H1-STAGES4-BLOCKS132"])
def test_tma_conv1_matches_float64_at_batch_10001(gpu, params):
    assert check_variant(gpu, NAME, params, (10001, 1, 4, 86, 86, 7, 1, (2, 2)), np.float32) <= VARIANT.tolerance


@pytest.mark.parametrize("shape", [(2, 4, 16, 40, 40, 7, 1, (4, 4)),   # LeNet-86's conv2
                                   (2, 1, 4, 86, 86, 6, 1, (2, 2)),    # even K
                                   (2, 1, 4, 87, 86, 7, 1, (2, 2))],   # images not whole 16-byte chunks
                         ids=["conv2", "k6", "h87"])
def test_shapes_outside_its_constraints_are_refused_not_computed(gpu, shape):
    assert check_variant(gpu, NAME, VARIANT.defaults(), shape, np.float32) == 0.0  # refused with the constraint


def test_lenet86_with_it_on_conv1_classifies_like_the_reference(tmp_path):
    """conv2 on wgmma_conv2: both convs of the forward on the Hopper route; batch 2000, every pass checked."""
    assert_job_classifies_like_the_reference({"conv1": NAME, "conv2": "wgmma_conv2"}, tmp_path)


@pytest.mark.parametrize("batch, streams, chunk", [(7, 3, 2), (301, 3, 64)])
def test_lenet86_with_it_on_conv1_in_chunks(batch, streams, chunk):
    """Chunks on several streams: each launch sees a sub-batch (x at an image offset, fewer images than
    blocks), its logits poisoned before each pass and checked against float64."""
    run = spec("events", batch=batch, repeats=2, streams=streams, host_memory="pinned", chunk_images=chunk,
               variants={"conv1": NAME, "conv2": "wgmma_conv2"}, params={"conv1": {}, "conv2": {}})
    measure_like_the_reference(run, VARIANT.tolerance)
