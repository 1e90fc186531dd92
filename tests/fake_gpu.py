"""A GPU made of numpy, for the CPU tests of jobs and the bench: device memory is numpy arrays (at their
real addresses), events tick a fake clock, the fake network computes with the float64-checked CPU
reference, and the harness's own kernels (kernels/truth.cu: the float64 truth, the rounds, the
comparisons) run as the host build tests/host_kernels.py makes of them."""
import contextlib
import ctypes

import numpy as np
import pytest

from convsweep.device.gpu import DeviceArray
from convsweep.base.paths import ROOT
from host_kernels import compiler, host_library
from convsweep.model.network import reference_forward
from convsweep.model.reference import conv2d_reference, maxpool2d_reference
from convsweep.measure.runner import Backend
from convsweep.measure.timing import FLUSH


class NoBuilds:
    def wait(self):
        return {}


@contextlib.contextmanager
def no_compile(requests, arch):
    """The fake backend compiles nothing (its ops are numpy)."""
    yield NoBuilds()


class FakeClock:
    now = 0.0


class FakeEvent:
    def __init__(self):
        FakeClock.now += 0.25
        self.t = FakeClock.now

    def __sub__(self, other):
        return self.t - other.t

    def sync(self):
        pass


class FakeStream:
    handle = 0

    def sync(self):
        pass

    def wait(self, event):
        pass


class FakeGpu:
    """Device memory in numpy, keyed by made-up addresses; copies and fills act on it at once."""

    name, arch, compute_capability = "Fake H100", "sm_90", 9.0
    uuid, pci_bus_id = "00000000-0000-4000-8000-00000000fake", None  # NVML finds no such GPU: nulls

    def __init__(self):
        self.blocks, self.next = {}, 1 << 20
        self.lasting, self.released = set(), set()
        self.device = type("Device", (), {"sync": lambda self: None})()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    @contextlib.contextmanager
    def scope(self):
        """As Gpu.scope: what is allocated inside, but `lasting` buffers, is gone once it ends. Here it is
        scribbled over and refused (mem), so a job that keeps using such a buffer fails its tests."""
        before = set(self.blocks)
        try:
            yield self
        finally:
            for base in set(self.blocks) - before - self.lasting:
                self.blocks[base][...] = 0xCD
                self.released.add(base)

    def driver_version(self):
        return "0"

    def stream(self):
        return FakeStream()

    def event(self, stream):
        return FakeEvent()

    def alloc(self, shape, dtype=np.float32, lasting=False):
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
        block = np.zeros(nbytes + 64, np.uint8)
        start = -block.ctypes.data % 64  # aligned as a device allocation is, for any element type
        self.blocks[block.ctypes.data + start] = block[start : start + nbytes]
        if lasting:
            self.lasting.add(block.ctypes.data + start)
        return DeviceArray(block.ctypes.data + start, tuple(shape), dtype)

    # The harness's kernels (kernels/truth.cu) as a host build: grid-stride loops, so one thread covers all.
    def module(self, build, private=False):
        if compiler() is None:
            pytest.skip("no C++ compiler (g++) to build kernels/truth.cu for the host")
        return host_library(ROOT / build.source)

    def kernel(self, module, name):
        return module[name]

    def launch(self, stream, kernel, grid, block, shared_bytes, *args):
        for (kind, _), pointer in zip(kernel.params, args):
            if kind is ctypes.c_void_p and pointer:
                self.mem(DeviceArray(int(pointer), (1,), np.dtype(np.uint8)))  # refuses a released buffer
        kernel.launch(1, 1, *args)

    def mem(self, dev: DeviceArray) -> np.ndarray:
        for base, block in self.blocks.items():
            if base <= dev.ptr < base + len(block):
                assert base not in self.released, f"{dev.ptr:#x} was released when the scope it was made in ended"
                assert dev.ptr - base + dev.nbytes <= len(block), "access past the end of an allocation"
                return block[dev.ptr - base : dev.ptr - base + dev.nbytes]
        raise AssertionError(f"no allocation holds {dev.ptr:#x}")

    def read(self, dev: DeviceArray) -> np.ndarray:
        return self.mem(dev).view(dev.dtype).reshape(dev.shape)

    def to_device(self, array, stream):
        array = np.ascontiguousarray(array)
        dev = self.alloc(array.shape, array.dtype)
        self.upload(array, dev, stream)
        return dev

    def host_array(self, shape, dtype, kind):
        return np.empty(shape, dtype)

    def upload(self, host, dev, stream):
        assert host.flags.c_contiguous and host.nbytes == dev.nbytes
        self.mem(dev)[:] = host.reshape(-1).view(np.uint8)

    def download(self, dev, host, stream):
        assert host.flags.c_contiguous and host.nbytes == dev.nbytes
        host.reshape(-1).view(np.uint8)[:] = self.mem(dev)

    def fill(self, dev, byte, stream):
        self.mem(dev)[:] = byte

    l2_bytes = 4096
    flushes = 0  # how many times any fake GPU wrote over its L2

    def l2_flusher(self):
        scratch = self.alloc((2 * self.l2_bytes,), np.uint8)

        def flush(stream):
            FakeGpu.flushes += 1
            self.fill(scratch, 0, stream)

        return flush

    def copy(self, dst, src, stream):
        self.mem(DeviceArray(dst.ptr, (src.nbytes,), np.dtype(np.uint8)))[:] = self.mem(src)

    captures = 0  # how many passes any fake GPU captured as a graph

    # persisting L2: what a library left set (the context's set-aside, streams with a window)
    persisting_l2_bytes, windows = 0, ()

    def persisting_l2(self, streams):
        return {"persisting_l2_bytes": self.persisting_l2_bytes, "windows": list(self.windows)}

    def reset_persisting_l2(self, streams):
        self.persisting_l2_bytes, self.windows = 0, ()

    idle_ms = 0.001  # what the device still had to do once a pass had ended

    def idle_wait_ms(self):
        return self.idle_ms

    def capture(self, stream, enqueue):
        FakeGpu.captures += 1
        return FakeGraph(enqueue)


class FakeGraph:
    """A captured pass: as with a real capture, capturing runs nothing and each launch runs it all."""

    def __init__(self, enqueue, log=None):
        self.enqueue, self.launches, self.log = enqueue, 0, log

    def launch(self, stream):
        self.launches += 1
        self.enqueue()

    def upload(self, stream):  # runs nothing, as cuGraphUpload
        self.uploads = getattr(self, "uploads", 0) + 1
        if self.log is not None:
            self.log.append(("upload",))


class ScriptedEvent:
    """An event that reads the next time (ms) of its GPU's script when recorded; it logs its
    recording and each wait for it."""

    def __init__(self, t, log):
        self.t, self.log = t, log
        log.append(("event", t))

    def __sub__(self, other):
        return self.t - other.t

    def sync(self):
        self.log.append(("sync", self.t))


class ScriptedGpu(FakeGpu):
    """A FakeGpu whose events read `times` (ms) in turn, and which keeps in `log`, in order, what a
    timer does with it: events recorded, waits, captures and L2 flushes; `graphs`: what it captured."""

    def __init__(self, times):
        super().__init__()
        self.times, self.log, self.graphs = iter(times), [], []

    def event(self, stream):
        return ScriptedEvent(next(self.times), self.log)

    def capture(self, stream, enqueue):
        self.log.append(("capture",))
        self.graphs.append(FakeGraph(enqueue, self.log))
        return self.graphs[-1]

    def l2_flusher(self):
        def flush(stream):
            self.log.append(("flush",))

        return flush


class FakeConvOp:
    """A variant's kernels as numpy: restrict_unroll computes a wrong answer, naive leaves the last image unwritten."""

    def __init__(self, gpu, variant, params, shape):
        self.gpu, self.variant = gpu, variant
        self.build = type("Build", (), {"record": lambda self: {"variant": variant.name, "cache_hit": True}})()

    def bind_weights(self, k, bias, stream):
        self.k, self.bias = k, bias

    def workspace(self, shape):
        return None

    def enqueue(self, stream, y, x, shape, workspace=None):
        out = conv2d_reference(self.gpu.read(x), self.gpu.read(self.k), self.gpu.read(self.bias), shape.S)
        if shape.P:
            out = maxpool2d_reference(np.maximum(out, 0), shape.P, shape.PS)
        if self.variant.name == "restrict_unroll":
            out = out + 1
        target = self.gpu.read(y)
        if self.variant.name == "naive":
            target[:-1] = out[:-1]
        else:
            target[...] = out


class FakeGpuNetwork:
    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        self.gpu, self.network, self.weights = gpu, network, weights
        self.lanes = [object() for _ in range(lanes)]
        self.capacity, self.builds = capacity, []
        # the timed layers, as the runner's steps have them (a fused network's conv1 swallows conv2)
        steps = network.steps({name: var.fuses for name, var in plan.variants.items()})
        self.timed = [step.layer for step in steps if step.layer.is_conv]

    def hold(self, stream, flag, timeout_ns=None):
        self.gpu.__dict__.setdefault("holds", []).append(int(flag[0]))

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        assert n <= self.capacity
        for layer in self.timed:
            if flush is not None:
                begin = self.gpu.event(stream)
                flush(stream)
                if events is not None:
                    events.setdefault(FLUSH, []).append((begin, self.gpu.event(stream)))
            if events is not None:
                events.setdefault(layer.name, []).append((self.gpu.event(stream), self.gpu.event(stream)))
        self.gpu.read(logits.rows(0, n))[...] = reference_forward(self.network, self.weights, self.gpu.read(x.rows(0, n)),
                                                                   dtype=np.float32)


FAKE = Backend(gpu=FakeGpu, conv_op=FakeConvOp, network=FakeGpuNetwork, compile_all=no_compile, devices=lambda: 1,
               peaks=lambda gpu, monitor: None)


class SteadyClock:
    """A host clock that advances `step_s` seconds each time it is read: passes that take the same
    time however loaded the machine is (a Backend's clock)."""

    def __init__(self, step_s: float):
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


class SlowingMonitor:
    """NVML as a script: the clocks drop from 1980 to 1755 MHz, the power cap holds them down after
    passes 1 and 3, and the energy counter gains 2500 mJ per reading (`energy_reads` counts them). It
    knows no GPU by UUID or driver (None, as NVML where it cannot tell). A Backend's `monitor` (it takes
    the GPU's UUID and PCI bus id, and is a context manager), or an observer's monitor as it is."""

    uuid = driver = None

    def __init__(self, uuid=None, pci_bus_id=None):
        self.readings, self.energy, self.energy_reads = 0, 1_000_000, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def clocks(self):
        return {"sm_mhz": 1980 if self.readings == 0 else 1755, "memory_mhz": 2619}

    def slowdowns(self):
        self.readings += 1
        return 0x4 if self.readings in (2, 4) else 0

    def energy_mj(self):
        self.energy_reads += 1
        self.energy += 2500
        return self.energy


class SteppingEveryEighthRead(SlowingMonitor):
    """An energy counter that steps 20 J every eighth reading: three timed passes cannot tell the power."""

    def energy_mj(self):
        self.energy_reads += 1
        return 1_000_000 + self.energy_reads // 8 * 20_000
