"""convsweep: reproducible sweeps of GPU convolution kernels.

The public Python API is `conv2d` (one conv layer with any registered variant, returning a
numpy array); sweeps run through Snakemake and the `convsweep` command.
"""
from convsweep.base.errors import CompileError, ConfigError, ConvsweepError, DataError, DeviceError, ShapeError, StoreError


def __getattr__(name: str):
    """`convsweep.conv2d` on first use: planning a sweep imports this package, not the GPU runtime."""
    if name == "conv2d":
        from convsweep.measure.runner import conv2d

        return conv2d
    raise AttributeError(f"module 'convsweep' has no attribute {name!r}")

__all__ = ["conv2d", "ConvsweepError", "ConfigError", "CompileError", "DataError", "DeviceError", "ShapeError", "StoreError"]
