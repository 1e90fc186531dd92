"""The runner's and the GPU runtime's checks that need no GPU."""
from types import SimpleNamespace

import pytest

from convsweep.base.errors import DeviceError, MachineError
from convsweep.device.gpu import count_devices, gpu_available
from convsweep.measure.runner import ConvOp, pass_chunks
from convsweep.model.variants import ConvShape, get_variant


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


class FakeDriver:
    """cuda.bindings' driver as the calls count_devices makes see it: cuInit's and cuDeviceGetCount's answers."""

    from cuda.bindings.driver import CUresult

    def __init__(self, init, count=1):
        self.init, self.count = init, count

    def cuInit(self, flags):
        if isinstance(self.init, Exception):
            raise self.init
        return (self.init,)

    def cuDeviceGetCount(self):
        return self.CUresult.CUDA_SUCCESS, self.count


@pytest.mark.parametrize("driver, why", [
    (FakeDriver(RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search.\nmore')),
     '"cuda" is an NVIDIA driver library and can only be found via system search.'),
    (FakeDriver(FakeDriver.CUresult.CUDA_ERROR_NO_DEVICE), "cuInit: CUDA_ERROR_NO_DEVICE"),
    (FakeDriver(FakeDriver.CUresult.CUDA_ERROR_STUB_LIBRARY), "cuInit: CUDA_ERROR_STUB_LIBRARY"),
    (FakeDriver(FakeDriver.CUresult.CUDA_SUCCESS, count=0), "the driver sees no device"),
])
def test_no_driver_or_device_is_the_machines_failure_in_convsweeps_words(driver, why):
    with pytest.raises(MachineError) as caught:
        count_devices(driver)
    assert str(caught.value) == f"no NVIDIA GPU or driver on this machine ({why})"


def test_a_driver_that_sees_devices_counts_them():
    assert count_devices(FakeDriver(FakeDriver.CUresult.CUDA_SUCCESS, count=2)) == 2


@pytest.mark.skipif(gpu_available()[0], reason="checks a machine without a GPU")
def test_opening_the_gpu_where_there_is_none_is_a_machine_error():
    from convsweep.device.gpu import Gpu

    with pytest.raises(MachineError, match=r"^no NVIDIA GPU or driver on this machine \(.+\)$"):
        Gpu()


class RecordingGpu:
    """What ConvOp asks of a GPU, recorded: buffers are addresses, launches (kernel, grid, args) a list."""

    name, compute_capability, arch = "Recording GPU", 9.0, "sm_90a"

    def __init__(self):
        self.allocations, self.launches = [], []

    def module(self, build, private=False):
        return build

    def kernel(self, module, name):
        return name

    def alloc(self, shape, dtype):
        from convsweep.device.gpu import DeviceArray
        import numpy as np

        self.allocations.append(shape)
        return DeviceArray(0x10000 * len(self.allocations), tuple(shape), np.dtype(dtype))

    def launch(self, stream, kernel, grid, block, shared_bytes, *args):
        self.launches.append((kernel, grid, [int(a) for a in args]))


def test_prepared_weights_are_written_once_per_binding_and_passed_to_every_launch():
    """Registry `prepare` (wgmma_fused_network: fc1's fragments and the B tiles): bind_weights allocates the
    buffer and runs prepare_weights with y, x null and B 1 (nothing of an input can reach it); each forward
    launch gets the buffer as PREPARED_ARG right after CONV_ARGS; binding again rewrites the same buffer."""
    import numpy as np
    from test_wgmma_fused import LENET, fused_shape

    from convsweep.device.gpu import DeviceArray

    variant, gpu = get_variant("wgmma_fused_network"), RecordingGpu()
    op = ConvOp(gpu, variant, variant.defaults(), fused_shape(LENET, 1), "sm_90a")
    weights = [DeviceArray(0x1000 * (i + 1), (1,), np.dtype(np.float32)) for i in range(8)]
    k, bias, tail = weights[0], weights[1], tuple(weights[2:])
    op.bind_weights(k, bias, "stream", tail)
    nbytes = variant.prepared_bytes(fused_shape(LENET, 1), variant.defaults())
    assert gpu.allocations == [(nbytes,)] and op.prepared.nbytes == nbytes
    (kernel, grid, args), = gpu.launches
    assert kernel == "prepare_weights" and grid == (21, 1, 1)
    assert args[:4] == [0, 0, k.ptr, bias.ptr] and args[4] == 1  # y, x null; B 1
    assert args[11] == op.prepared.ptr and args[12:14] == [2, 2] and args[14:] == [w.ptr for w in tail]
    y, x = DeviceArray(0xA0000, (10000, 10), np.dtype(np.float32)), DeviceArray(0xB0000, (10000, 1, 86, 86), np.dtype(np.float32))
    op.enqueue("stream", y, x, fused_shape(LENET, 10000))
    kernel, grid, args = gpu.launches[-1]
    assert kernel == "network_forward" and grid == (264, 1, 1) and len(gpu.launches) == 2  # no per-forward prepare
    assert args[:5] == [y.ptr, x.ptr, k.ptr, bias.ptr, 10000] and args[11] == op.prepared.ptr
    op.bind_weights(k, bias, "stream", tail)  # new weights: prepared again, into the buffer it has
    assert [launch[0] for launch in gpu.launches] == ["prepare_weights", "network_forward", "prepare_weights"]
    assert len(gpu.allocations) == 1 and gpu.launches[-1][2][11] == op.prepared.ptr
