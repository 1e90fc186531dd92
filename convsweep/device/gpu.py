"""The GPU runtime on cuda.core: one `Gpu` owns the device, its streams, modules and buffers.

Every resource is created through the Gpu and released in `close()` (it is a context
manager), in the reverse order of creation, so a failed job leaves nothing behind.
Host<->device copies go through cuda.bindings' driver calls because they take raw host
pointers: a numpy array, a pinned buffer or a registered array alike.
"""
from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convsweep.base.errors import DeviceError, MachineError

HOST_MEMORY_KINDS = ("pageable", "pinned", "registered")


def cu():
    """cuda.bindings' driver API, the one place this module imports it: on first use, so that planning a sweep
    (which imports this module for its names) never loads CUDA."""
    from cuda.bindings import driver

    return driver


def _window_attribute():
    return cu().CUstreamAttrID.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW


def _check(result, what: str):
    """Unwrap a cuda.bindings (err, *values) tuple, raising DeviceError with the driver's words."""
    driver = cu()

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise DeviceError(f"{what} failed: {name.decode() if name else err}")
    return values[0] if len(values) == 1 else values


def gpu_available() -> tuple[bool, str]:
    """(True, name) when a CUDA device can be used here, else (False, why): for skips and 'auto'."""
    try:
        from cuda.core import Device

        dev = Device(0)
        dev.set_current()
        return True, dev.name
    except Exception as e:  # no driver, no device, or a broken install
        return False, f"no usable CUDA device ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def no_gpu(why: str) -> MachineError:
    """The machine has no GPU to run on: convsweep's words first, the underlying error's first line after."""
    first = why.splitlines()[0] if why else "no reason given"
    return MachineError(f"no NVIDIA GPU or driver on this machine ({first})")


def count_devices(driver=None) -> int:
    """How many CUDA devices the driver sees; MachineError (no_gpu) when the driver library cannot be
    loaded, cuInit fails or it sees none. `driver`: cuda.bindings' driver module, or a test's stand-in."""
    try:
        if driver is None:
            driver = cu()
        (err,) = driver.cuInit(0)
        count = 0
        if err == driver.CUresult.CUDA_SUCCESS:
            err, count = driver.cuDeviceGetCount()
    except Exception as e:  # no libcuda: cuda-pathfinder's DynamicLibNotFoundError, raised at the first call
        raise no_gpu(str(e) or type(e).__name__) from None
    if err != driver.CUresult.CUDA_SUCCESS:
        raise no_gpu(f"cuInit: {getattr(err, 'name', err)}")
    if count == 0:
        raise no_gpu("the driver sees no device")
    return count


@dataclass
class DeviceArray:
    """A typed view of (part of) a device buffer."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def arg(self) -> np.uintp:
        """The pointer as a kernel argument (a 64-bit integer is what a pointer parameter holds)."""
        return np.uintp(self.ptr)

    def rows(self, start: int, stop: int) -> DeviceArray:
        """Images start..stop of a batch-major array, without copying."""
        row = int(np.prod(self.shape[1:])) * self.dtype.itemsize
        return DeviceArray(self.ptr + start * row, (stop - start,) + tuple(self.shape[1:]), self.dtype)

    def reshaped(self, shape: tuple[int, ...]) -> DeviceArray:
        """The same elements under another shape (a flatten), without copying."""
        assert int(np.prod(shape)) == int(np.prod(self.shape)), f"reshape {self.shape} -> {shape}"
        return DeviceArray(self.ptr, tuple(shape), self.dtype)


class Gpu:
    def __init__(self, device_id: int = 0):
        """Open CUDA device `device_id` (a context made current on this thread). Failing to is always the
        machine's failure (MachineError), never a kernel's: nothing of a job has run on the GPU yet."""
        count_devices()
        try:
            from cuda.core import Device

            self.device = Device(device_id)
            self.device.set_current()
        except Exception as e:  # an ordinal past the devices, a GPU busy in exclusive mode, no memory for a context
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise MachineError(f"cannot open CUDA device {device_id} ({first})") from None
        self._owned: list = []  # buffers, streams, events: closed in reverse order
        self._lasting: list = []  # buffers no scope releases (alloc's `lasting`): closed last
        self._registered: list[int] = []
        self._modules: dict = {}
        self._l2_scratch: DeviceArray | None = None  # l2_flusher's buffer

    # -- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.device.name

    @property
    def arch(self) -> str:
        """NVRTC's target for this GPU (provenance.own_arch: sm_90a on an H100)."""
        from .provenance import own_arch

        cc = self.device.compute_capability
        return own_arch(cc.major, cc.minor)

    @property
    def compute_capability(self) -> float:
        cc = self.device.compute_capability
        return cc.major + cc.minor / 10

    @property
    def uuid(self) -> str:
        """The device's UUID: what names it across processes (CUDA_VISIBLE_DEVICES renumbers ordinals)."""
        return str(self.device.uuid)

    @property
    def pci_bus_id(self) -> str | None:
        try:
            return str(self.device.pci_bus_id)
        except Exception:  # older cuda.core; NVML then finds the device by UUID alone
            return None

    @property
    def l2_bytes(self) -> int:
        return int(self.device.properties.l2_cache_size)

    def driver_version(self) -> str:
        driver = cu()

        version = int(_check(driver.cuDriverGetVersion(), "cuDriverGetVersion"))
        return f"{version // 1000}.{version % 1000 // 10}"  # 13000 -> "13.0": the CUDA version it supports

    # -- resources ------------------------------------------------------------------------
    def stream(self):
        s = self.device.create_stream()
        self._owned.append(s)
        return s

    def event(self, stream):
        """A timing event recorded on `stream` now."""
        from cuda.core import EventOptions

        return stream.record(options=EventOptions(timing_enabled=True))

    def alloc(self, shape, dtype=np.float32, lasting: bool = False) -> DeviceArray:
        """A device buffer, released when the scope it was made in ends; `lasting`: only when the Gpu closes (a
        job's buffers that grow on first use, wherever that is: the truth's, the freshness ledger's)."""
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
        try:
            buf = self.device.allocate(nbytes, stream=self.device.default_stream)
        except Exception as e:
            raise DeviceError(f"cannot allocate {nbytes} bytes on {self.name}: {e}") from None
        (self._lasting if lasting else self._owned).append(buf)
        return DeviceArray(int(buf.handle), tuple(shape), dtype)

    def to_device(self, array: np.ndarray, stream) -> DeviceArray:
        array = np.ascontiguousarray(array)
        dev = self.alloc(array.shape, array.dtype)
        self.upload(array, dev, stream)
        stream.sync()
        return dev

    def host_array(self, shape, dtype, kind: str) -> np.ndarray:
        """A host array of the given kind: pageable (numpy), pinned (page-locked allocation) or
        registered (a numpy array page-locked in place, as a user's own buffer would be)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if kind == "pageable":
            return np.empty(shape, dtype)
        if kind == "pinned":
            from cuda.core import LegacyPinnedMemoryResource

            buf = LegacyPinnedMemoryResource().allocate(max(nbytes, 1))
            self._owned.append(buf)
            raw = (ctypes.c_char * max(nbytes, 1)).from_address(int(buf.handle))
            return np.frombuffer(raw, dtype, count=int(np.prod(shape))).reshape(shape)
        if kind == "registered":
            driver = cu()

            array = np.empty(shape, dtype)
            if nbytes:
                _check(driver.cuMemHostRegister(array.ctypes.data, nbytes, 0), "cuMemHostRegister")
                self._registered.append(array.ctypes.data)
                self._owned.append(array)  # keep the memory alive until it is unregistered
            return array
        raise DeviceError(f"host_memory: expected one of {HOST_MEMORY_KINDS}, got {kind!r}")

    def upload(self, host: np.ndarray, dev: DeviceArray, stream) -> None:
        driver = cu()

        assert host.flags.c_contiguous and host.nbytes == dev.nbytes, "upload: shape mismatch"
        _check(driver.cuMemcpyHtoDAsync(dev.ptr, host.ctypes.data, host.nbytes, int(stream.handle)), "cuMemcpyHtoDAsync")

    def download(self, dev: DeviceArray, host: np.ndarray, stream) -> None:
        driver = cu()

        assert host.flags.c_contiguous and host.nbytes == dev.nbytes, "download: shape mismatch"
        _check(driver.cuMemcpyDtoHAsync(host.ctypes.data, dev.ptr, host.nbytes, int(stream.handle)), "cuMemcpyDtoHAsync")

    def fill(self, dev: DeviceArray, byte: int, stream) -> None:
        driver = cu()

        _check(driver.cuMemsetD8Async(dev.ptr, byte, dev.nbytes, int(stream.handle)), "cuMemsetD8Async")

    def l2_flusher(self) -> Callable[[object], None]:
        """A function that, enqueued on a stream, writes over a buffer of twice the L2 size, so the
        next kernel finds none of its inputs in L2 (nvbench's cold measurements write one L2's
        worth; twice leaves no line to the cache's hashing). One buffer per GPU, made on first use
        (every cold setting of a job shares it), lives until close()."""
        if self._l2_scratch is None:
            self._l2_scratch = self.alloc((2 * self.l2_bytes // 4,), np.uint32)
        scratch = self._l2_scratch
        return lambda stream: self.fill(scratch, 0, stream)

    def module(self, build, private: bool = False):
        """The loaded module of a CompiledModule: shared by default, or a private instance whose
        __constant__ globals belong to one caller (two layers must not share them)."""
        from cuda.core import ObjectCode

        key = (build.name, build.options_hash, build.source_hash, build.arch)
        if private or key not in self._modules:
            try:
                module = ObjectCode.from_cubin(build.cubin)
                _ = module.handle  # load now, so a bad cubin fails here with its name
            except Exception as e:
                raise DeviceError(f"cannot load module of '{build.name}' ({build.arch}) on {self.name}: {e}") from None
            if private:
                self._owned.append(module)
                return module
            self._modules[key] = module
        return self._modules[key]

    def kernel(self, module, name: str):
        """A kernel of a loaded module, allowed the device's whole dynamic shared memory: launches
        asking for more than the default 48 KB (a registry shared_bytes) then just work."""
        driver = cu()

        try:
            kernel = module.get_kernel(name)
        except Exception as e:
            raise DeviceError(f"module has no kernel '{name}': {e}") from None
        optin = self.device.properties.max_shared_memory_per_block_optin - kernel.attributes.shared_size_bytes
        attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        handle = kernel.handle
        if isinstance(handle, driver.CUkernel):
            _check(driver.cuKernelSetAttribute(attribute, optin, handle, driver.CUdevice(self.device.device_id)),
                   "cuKernelSetAttribute")
        else:
            _check(driver.cuFuncSetAttribute(handle, attribute, optin), "cuFuncSetAttribute")
        return kernel

    def global_array(self, module, name: str, dtype=np.float32) -> DeviceArray:
        """A module-scope __device__/__constant__ variable as a device array."""
        driver = cu()

        symbol = name.encode()
        handle = module.handle
        if isinstance(handle, driver.CUlibrary):
            ptr, nbytes = _check(driver.cuLibraryGetGlobal(handle, symbol), f"cuLibraryGetGlobal({name})")
        else:
            ptr, nbytes = _check(driver.cuModuleGetGlobal(handle, symbol), f"cuModuleGetGlobal({name})")
        return DeviceArray(int(ptr), (int(nbytes) // np.dtype(dtype).itemsize,), np.dtype(dtype))

    def copy(self, dst: DeviceArray, src: DeviceArray, stream) -> None:
        driver = cu()

        assert src.nbytes <= dst.nbytes, "copy: destination too small"
        _check(driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, int(stream.handle)), "cuMemcpyDtoDAsync")

    def launch(self, stream, kernel, grid, block, shared_bytes, *args) -> None:
        from cuda.core import LaunchConfig, launch

        try:
            launch(stream, LaunchConfig(grid=grid, block=block, shmem_size=shared_bytes), kernel, *args)
        except Exception as e:
            raise DeviceError(f"launch of grid {grid} block {block} failed: {e}") from None

    def capture(self, stream, enqueue: Callable[[], object]) -> CapturedGraph:
        """The work `enqueue` puts on `stream` (and on the streams it forks from it with an event and
        joins back) captured as a CUDA graph, instantiated: nothing runs until the graph is launched.
        Copies must be from pinned or registered host memory (pageable ones cannot be captured)."""
        driver = cu()

        handle = int(stream.handle)
        _check(driver.cuStreamBeginCapture(handle, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture")
        try:
            enqueue()
        except BaseException:
            err, graph = driver.cuStreamEndCapture(handle)  # ends the capture; its error is the one raised
            if err == driver.CUresult.CUDA_SUCCESS and graph:
                driver.cuGraphDestroy(graph)
            raise
        graph = _check(driver.cuStreamEndCapture(handle), "cuStreamEndCapture")
        try:
            executable = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BaseException:
            driver.cuGraphDestroy(graph)
            raise
        captured = CapturedGraph(graph, executable)
        self._owned.append(captured)
        return captured

    # -- device state timing must not inherit -----------------------------------------------
    def persisting_l2(self, streams) -> dict:
        """The persisting-L2 state a kernel or a library may have left: the context's set-aside for
        persisting lines (bytes) and the `streams` (their positions) carrying an access-policy window.
        A window over a layer's input would keep it in L2 across passes: faster than the DRAM it
        stands for (llm.c #851 measured 4x the HBM peak this way)."""
        driver = cu()

        limit = _check(driver.cuCtxGetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE), "cuCtxGetLimit")
        windows = []
        for i, stream in enumerate(streams):
            value = _check(driver.cuStreamGetAttribute(int(stream.handle), _window_attribute()), "cuStreamGetAttribute")
            if value.accessPolicyWindow.num_bytes:
                windows.append(i)
        return {"persisting_l2_bytes": int(limit), "windows": windows}

    def reset_persisting_l2(self, streams) -> None:
        """No set-aside for persisting lines, no access-policy window on `streams`, and every line
        already persisting back to normal."""
        driver = cu()

        _check(driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0), "cuCtxSetLimit")
        for stream in streams:
            _check(driver.cuStreamSetAttribute(int(stream.handle), _window_attribute(), driver.CUstreamAttrValue()),
                   "cuStreamSetAttribute")
        _check(driver.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")

    def idle_wait_ms(self) -> float:
        """How long the device still worked once this is called (ms of the host clock): the time of
        a device-wide synchronize, less that of a second one right after it (the call's own cost,
        tens of microseconds under a profiler). About 0 when the device is idle; more where work
        runs that no stream of the caller waits for."""
        t0 = time.perf_counter()
        self.device.sync()
        t1 = time.perf_counter()
        self.device.sync()
        t2 = time.perf_counter()
        return max(0.0, (t1 - t0) - (t2 - t1)) * 1e3

    @contextlib.contextmanager
    def scope(self):
        """Resources created inside the block are released when it ends (after the device is idle):
        a job measures one tunable setting after another this way in one context."""
        owned, registered = len(self._owned), len(self._registered)
        try:
            yield self
        finally:
            self._release(owned, registered)

    def _release(self, owned: int = 0, registered: int = 0) -> None:
        driver = cu()

        try:
            self.device.sync()
        finally:
            for ptr in reversed(self._registered[registered:]):
                driver.cuMemHostUnregister(ptr)
            del self._registered[registered:]
            for obj in reversed(self._owned[owned:]):
                if hasattr(obj, "close"):
                    obj.close()
            del self._owned[owned:]

    def close(self) -> None:
        try:
            self._release()
        finally:
            for buf in reversed(self._lasting):
                buf.close()
            self._lasting.clear()
            self._modules.clear()

    def __enter__(self) -> Gpu:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CapturedGraph:
    """Work captured once (Gpu.capture) and replayed with one launch: the host pays one call per
    replay instead of one per copy, kernel and event. Owned by its Gpu, which closes it."""

    def __init__(self, graph, executable):
        self._graph, self._executable = graph, executable

    def launch(self, stream) -> None:
        driver = cu()

        _check(driver.cuGraphLaunch(self._executable, int(stream.handle)), "cuGraphLaunch")

    def upload(self, stream) -> None:
        """Put the graph's work on the device ahead of its first launch (which would otherwise do
        it, slower than every launch after it), running none of it."""
        driver = cu()

        _check(driver.cuGraphUpload(self._executable, int(stream.handle)), "cuGraphUpload")

    def close(self) -> None:
        driver = cu()

        if self._executable is not None:
            driver.cuGraphExecDestroy(self._executable)
            driver.cuGraphDestroy(self._graph)
            self._executable = self._graph = None
