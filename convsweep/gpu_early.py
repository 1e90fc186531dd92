"""The CUDA context, created on a thread while the job process imports and loads.

cuInit and the primary context cost a job process 0.2–0.5 s on the lent H100 (~0.7 s under nsys),
about as long as its imports of numpy and cuda.core. cuda.bindings releases the GIL in driver
calls, so started first on a thread the two overlap. `gpu.Gpu` then retains the same primary
context (cuda.core's Device.set_current) and finds it made; the thread's own reference lasts
until the process ends.
"""
from __future__ import annotations

import threading


def start_primary_context(device_id: int = 0) -> threading.Thread:
    """Begin creating device `device_id`'s primary context; any failure is left to `Gpu()` to report."""

    def create() -> None:
        try:
            from cuda.bindings import driver

            (err,) = driver.cuInit(0)
            if err != driver.CUresult.CUDA_SUCCESS:
                return
            err, device = driver.cuDeviceGet(device_id)
            if err == driver.CUresult.CUDA_SUCCESS:
                driver.cuDevicePrimaryCtxRetain(device)
        except Exception:  # no driver library or no GPU: opening the GPU says so, in the job's words
            pass

    thread = threading.Thread(target=create, name="cuda-context", daemon=True)
    thread.start()
    return thread
