"""RED TEAM, host side: networks that cheat the way a library could, around honest kernels.

Each is a convsweep.measure.runner.GpuNetwork handed to a job through `runner.Backend(network=...)`; its
kernels compute the right answer, so no output check can see the cheat:

- `SideStreamNetwork` launches, after each conv layer, that layer's conv again (SIDE_REPEATS
  times, into a scratch buffer) on a stream of its own, forked from the pass's stream by an event
  and never joined back: the pass's end event does not wait for it. Caught by the probe after each
  timed pass (convsweep.measure.integrity: work "still running" on the GPU), so the run is `suspect`.
- `PersistingL2Network` sets aside the largest persisting part of L2 the device allows
  (cuCtxSetLimit, CU_LIMIT_PERSISTING_L2_CACHE_SIZE) and puts an access-policy window with
  hitProp PERSISTING over the network's input on the pass's stream (cuStreamSetAttribute), so the
  input stays in L2 from one pass to the next. With `once=True` it sets only the set-aside, in
  __init__ (a window belongs to a stream, and the network meets the pass's streams only when a
  pass is enqueued): the harness finds it before timing and resets it, and the run is `ok`. Set at
  every enqueue, it is back during the timed passes: found again after them, the run is `suspect`.

The binding names are cuda-bindings 13's: the stream attribute is CUstreamAttrID's
CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW (CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW of cuda.h is an
alias of it), its value a CUstreamAttrValue whose accessPolicyWindow is a CUaccessPolicyWindow.
"""
from __future__ import annotations

from convsweep.device.gpu import DeviceArray, _check
from convsweep.measure.runner import ConvOp, GpuNetwork

SIDE_REPEATS = 8  # convs on the side stream per layer and pass: several times the pass's own work


class _ConvWithSideWork:
    """A layer's ConvOp whose every launch is followed, on `side`, by SIDE_REPEATS more into `scratch`."""

    def __init__(self, op: ConvOp, gpu, side, scratch: DeviceArray, workspace: DeviceArray | None, repeats: int):
        self.op, self.gpu, self.side, self.scratch, self.side_workspace, self.repeats = \
            op, gpu, side, scratch, workspace, repeats

    def enqueue(self, stream, y: DeviceArray, x: DeviceArray, shape, workspace: DeviceArray | None = None,
                absorbed_args: tuple = ()):
        self.op.enqueue(stream, y, x, shape, workspace, absorbed_args)
        self.side.wait(self.gpu.event(stream))  # fork after the layer; nothing ever waits for `side`
        for _ in range(self.repeats):
            self.op.enqueue(self.side, self.scratch.rows(0, shape.B), x, shape, self.side_workspace, absorbed_args)

    def __getattr__(self, name):  # the ConvOp's build, variant, weights, ... for whoever reads them
        return getattr(self.op, name)


class SideStreamNetwork(GpuNetwork):
    """Honest layers, plus heavy work on a stream the pass never joins (module docstring)."""

    def __init__(self, gpu, network, weights, plan, lanes, capacity, repeats: int = SIDE_REPEATS):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        self.side = gpu.stream()
        for step in self.steps:
            if step.layer.is_conv:
                name, shape = step.layer.name, self.shape(step, capacity)
                op = self.convs[name]
                scratch = gpu.alloc(shape.out_shape, self.dtype)
                self.convs[name] = _ConvWithSideWork(op, gpu, self.side, scratch, op.workspace(shape), repeats)


def persisting_l2_limits() -> tuple[int, int]:
    """(the most L2 bytes the current device lets a context set aside for persisting lines, the
    largest access-policy window in bytes); 0 where it has no persisting L2."""
    from cuda.bindings import driver

    device = _check(driver.cuCtxGetDevice(), "cuCtxGetDevice")
    attribute = driver.CUdevice_attribute
    most = _check(driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, device),
                  "cuDeviceGetAttribute")
    window = _check(driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, device),
                    "cuDeviceGetAttribute")
    return int(most), int(window)


def set_aside_persisting_l2(nbytes: int) -> None:
    """cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize) on the current context."""
    from cuda.bindings import driver

    _check(driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, nbytes), "cuCtxSetLimit")


def set_persisting_window(stream, array: DeviceArray, set_aside: int, max_window: int) -> None:
    """An access-policy window over `array` on `stream`: its lines persist in L2 (as many as the
    set-aside holds, hitRatio), the rest stream."""
    from cuda.bindings import driver

    window = driver.CUaccessPolicyWindow()
    window.base_ptr = array.ptr
    window.num_bytes = min(array.nbytes, max_window)
    window.hitRatio = min(1.0, set_aside / max(window.num_bytes, 1))
    window.hitProp = driver.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
    window.missProp = driver.CUaccessProperty.CU_ACCESS_PROPERTY_STREAMING
    value = driver.CUstreamAttrValue()
    value.accessPolicyWindow = window
    attribute = driver.CUstreamAttrID.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
    _check(driver.cuStreamSetAttribute(int(stream.handle), attribute, value), "cuStreamSetAttribute")


class PersistingL2Network(GpuNetwork):
    """Honest layers on an input kept in persisting L2 (module docstring); `once`: the set-aside
    alone, in __init__."""

    def __init__(self, gpu, network, weights, plan, lanes, capacity, once: bool = False):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        self.once = once
        self.set_aside, self.max_window = persisting_l2_limits()
        set_aside_persisting_l2(self.set_aside)

    def enqueue(self, stream, lane, x: DeviceArray, logits: DeviceArray, n: int, events=None, flush=None):
        if not self.once:
            set_aside_persisting_l2(self.set_aside)
            set_persisting_window(stream, x.rows(0, n), self.set_aside, self.max_window)
        super().enqueue(stream, lane, x, logits, n, events, flush)
