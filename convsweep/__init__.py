"""convsweep: reproducible sweeps of GPU convolution kernels.

The public Python API is `conv2d` (one conv layer with any registered variant, returning a
numpy array); sweeps run through Snakemake and the `convsweep` command.
"""
from .errors import CompileError, ConfigError, ConvsweepError, DataError, DeviceError, ShapeError, StoreError
from .runner import conv2d

__all__ = ["conv2d", "ConvsweepError", "ConfigError", "CompileError", "DataError", "DeviceError", "ShapeError", "StoreError"]
