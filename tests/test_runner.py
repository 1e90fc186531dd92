"""The runner's checks that need no GPU."""
from types import SimpleNamespace

import pytest

from convsweep.errors import DeviceError
from convsweep.runner import ConvOp, pass_chunks
from convsweep.variants import ConvShape, get_variant


def test_a_variant_newer_than_the_gpu_is_refused_before_it_compiles():
    variant = get_variant("wmma_16x16x16")
    old_gpu = SimpleNamespace(name="Old GPU", compute_capability=variant.min_cc - 1.0, arch="sm_60")
    with pytest.raises(DeviceError, match=rf"'wmma_16x16x16' needs compute capability {variant.min_cc}, Old GPU has"):
        ConvOp(old_gpu, variant, variant.defaults(), ConvShape(B=1, C=4, M=16, H=40, W=40, K=7))


def test_pass_chunks_cover_the_batch_once():
    for batch, streams, size in ((10000, 1, None), (10000, 4, None), (24, 4, None), (10000, 4, 1250), (7, 2, 3)):
        chunks = pass_chunks(batch, streams, size)
        assert chunks[0][0] == 0 and chunks[-1][1] == batch
        assert all(hi == lo2 for (_, hi), (lo2, _) in zip(chunks, chunks[1:]))
        if size:
            assert max(hi - lo for lo, hi in chunks) == min(size, batch)
    assert pass_chunks(10000, 1) == [(0, 10000)]  # one stream: one chunk, nothing to overlap
    assert len(pass_chunks(10000, 4)) == 16  # four chunks per stream by default
