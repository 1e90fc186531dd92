"""wgmma_conv2 on a Hopper GPU (skipped with the reason elsewhere): against float64 on fresh random inputs
with NaN-poisoned outputs (conv2d poisons them), at batches 1, 7 and 10001 and at the odd shapes its
registry constraints allow; and LeNet-86 with it on conv2 classifies like the reference."""
import numpy as np
import pytest

from kernel_checks import assert_job_classifies_like_the_reference, gpu_fixture, setting_id
from test_gpu import check_variant

from convsweep.model.variants import load_registry

pytestmark = pytest.mark.gpu

NAME = "wgmma_conv2"
VARIANT = load_registry()[NAME]
# B, C, M, H, W, K, S, pool: LeNet-86's conv2 at three batches, then shapes that walk the kernel's edges
SHAPES = {
    "conv2-b1": (1, 4, 16, 40, 40, 7, 1, (4, 4)),
    "conv2-b7": (7, 4, 16, 40, 40, 7, 1, (4, 4)),
    "pad-past-w-partial-pass": (5, 2, 16, 25, 24, 5, 1, (2, 2)),  # staged rows padded (24 -> 40), 10 pooled rows
    "one-tile-four-bands": (3, 6, 16, 19, 20, 5, 1, (2, 2)),  # 16 columns: 4 bands side by side per wgmma
    "k8-pool4": (2, 2, 16, 27, 24, 8, 1, (4, 4)),  # K = 8: every kernel column of k16 used
    "wide-64-columns": (2, 2, 16, 40, 68, 5, 1, (2, 2)),  # 4 tiles of 16 pixels: one band per wgmma
}
CASES = VARIANT.all_combinations()
gpu = gpu_fixture(VARIANT)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("params", CASES, ids=setting_id)
def test_wgmma_conv2_matches_float64(gpu, params, shape):
    from convsweep.model.variants import ConvShape

    B, C, M, H, W, K, S, pool = shape
    VARIANT.check_shape(ConvShape(B, C, M, H, W, K, S, *pool), params)  # each shape here is one it takes
    errors = [check_variant(gpu, NAME, params, shape, np.float32) for _ in range(2)]  # fresh inputs each time
    assert max(errors) <= VARIANT.tolerance, errors


# > BLOCKS: every block takes 25-76 images through its two buffers; a float64 reference of ~2 s each
@pytest.mark.parametrize("params", [VARIANT.defaults(), {**VARIANT.defaults(), "WG": 1, "PR": 2, "BLOCKS": 132}],
                         ids=["defaults", "WG1-PR2-BLOCKS132"])
def test_wgmma_conv2_matches_float64_at_batch_10001(gpu, params):
    assert check_variant(gpu, NAME, params, (10001, 4, 16, 40, 40, 7, 1, (4, 4)), np.float32) <= VARIANT.tolerance


@pytest.mark.parametrize("shape", [(2, 1, 4, 86, 86, 7, 1, (2, 2)),   # LeNet-86's conv1: odd C, M 4
                                   (2, 4, 8, 40, 40, 7, 1, (4, 4)),    # M 8
                                   (2, 4, 16, 40, 42, 7, 1, (4, 4))],  # W % 4 != 0
                         ids=["conv1", "m8", "w42"])
def test_shapes_outside_its_constraints_are_refused_not_computed(gpu, shape):
    assert check_variant(gpu, NAME, VARIANT.defaults(), shape, np.float32) == 0.0  # refused with the constraint


def test_lenet86_with_it_on_conv2_classifies_like_the_reference(tmp_path):
    """conv1 on fp16_sliding_window (wgmma_conv2 computes conv2's shape alone); batch 2000, every pass checked."""
    assert_job_classifies_like_the_reference({"conv1": "fp16_sliding_window", "conv2": NAME}, tmp_path)
