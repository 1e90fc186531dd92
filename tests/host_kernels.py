"""kernels/truth.cu on the CPU: its grid-stride kernels built as a host library with g++ (tests/host_cuda.h
stands in for CUDA's qualifiers and indices), each callable with a grid and a block as a launch would be.

The CPU tests hold the harness's float64 kernels to numpy this way, and tests/fake_gpu.py runs them on
its numpy memory: every check of convsweep.measure.integrity then runs the kernels it runs on the GPU, on a
machine without one. A launch runs its threads one after another, so only kernels without shared memory
or synchronization (all of truth.cu's) give the GPU's answer.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SHIM = Path(__file__).with_name("host_cuda.h")
_MARK = "__convsweep_kernel__"
_SIGNATURE = re.compile(r'extern\s+"C"\s+' + _MARK + r'\s+void\s+(\w+)\s*\(([^)]*)\)')
_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "i64": ctypes.c_longlong,
           "unsigned long long": ctypes.c_ulonglong, "u64": ctypes.c_ulonglong, "float": ctypes.c_float,
           "double": ctypes.c_double}


def compiler() -> str | None:
    """The C++ compiler the host builds use, or None (the tests that need one skip)."""
    return shutil.which(os.environ.get("CXX", "g++"))


def _flags(source: Path) -> list[str]:
    return ["-std=gnu++17", "-O2", "-DCONVSWEEP_HOST", "-include", str(SHIM), f"-I{source.parent}"]


@dataclass(frozen=True)
class HostKernel:
    """One kernel of a host library: `launch(grid, block, *args)` runs every thread of the grid."""

    name: str
    params: tuple[tuple[type, str], ...]  # (ctypes type, parameter name)
    function: object

    def launch(self, grid, block, *args) -> None:
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}: {len(self.params)} arguments expected, {len(args)} given")
        converted = [kind(int(a) if kind in (ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_ulonglong)
                          else float(a)) for (kind, _), a in zip(self.params, args)]
        self.function(*_dims(grid), *_dims(block), *converted)


def _dims(d) -> tuple[int, int, int]:
    d = (d,) if isinstance(d, int) else tuple(d)
    return tuple(int(v) for v in (*d, 1, 1, 1)[:3])


def _ctype(declaration: str) -> tuple[type, str]:
    """(ctypes type, name) of one C parameter: pointers are addresses, the rest by their base type."""
    words = declaration.replace("*", " * ").split()
    name = words[-1]
    if "*" in words:
        return ctypes.c_void_p, name
    base = " ".join(w for w in words[:-1] if w not in ("const", "__restrict__", "__restrict", "volatile"))
    return _CTYPES[base], name


def _kernels(source: Path) -> list[tuple[str, str]]:
    """(name, parameter list) of each kernel of `source`, its macros expanded."""
    text = subprocess.run([compiler(), "-x", "c++", *_flags(source), f"-D__global__={_MARK}", "-E", "-P", str(source)],
                          check=True, capture_output=True, text=True).stdout
    return [(m[1], " ".join(m[2].split())) for m in _SIGNATURE.finditer(text)]


def _wrapper(source: Path, kernels: list[tuple[str, str]]) -> str:
    lines = [f'#include "{source}"', "HostDim3 threadIdx, blockIdx, blockDim, gridDim;"]
    for name, params in kernels:
        names = ", ".join(_ctype(p)[1] for p in params.split(","))
        lines += [f'extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
                  f"unsigned bz, {params}) {{",
                  "    gridDim = {gx, gy, gz}; blockDim = {bx, by, bz};",
                  "    for (unsigned k_ = 0; k_ < gz; ++k_) for (unsigned j_ = 0; j_ < gy; ++j_) for (unsigned i_ = 0; i_ < gx; ++i_)",
                  "    for (unsigned tk_ = 0; tk_ < bz; ++tk_) for (unsigned tj_ = 0; tj_ < by; ++tj_)",
                  "    for (unsigned ti_ = 0; ti_ < bx; ++ti_) {",
                  "        blockIdx = {i_, j_, k_}; threadIdx = {ti_, tj_, tk_};",
                  f"        {name}({names});",
                  "    }", "}"]
    return "\n".join(lines) + "\n"


@functools.cache
def host_library(source: str | Path) -> dict[str, HostKernel]:
    """Every kernel of `source` built for the host (once per source text and shim, cached on disk)."""
    from convsweep.base.paths import cache_dir

    source = Path(source).resolve()
    kernels = _kernels(source)
    wrapper = _wrapper(source, kernels)
    key = hashlib.sha256("\0".join([source.read_text(), SHIM.read_text(), wrapper]).encode()).hexdigest()[:24]
    library = cache_dir() / "host-kernels" / f"{source.stem}-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            cpp = Path(tmp) / "wrapper.cpp"
            cpp.write_text(wrapper)
            built = Path(tmp) / library.name
            subprocess.run([compiler(), *_flags(source), "-D__global__=", "-shared", "-fPIC",
                            "-o", str(built), str(cpp)], check=True, capture_output=True, text=True)
            os.replace(built, library)
    lib = ctypes.CDLL(str(library))
    found = {}
    for name, params in kernels:
        function = getattr(lib, f"launch_{name}")
        signature = tuple(_ctype(p) for p in params.split(","))
        function.argtypes = [ctypes.c_uint] * 6 + [kind for kind, _ in signature]
        function.restype = None
        found[name] = HostKernel(name, signature, function)
    return found


def grid_of(count: int, threads: int = 1) -> tuple[int, int]:
    """A small grid for a host launch of `count` outputs (grid-stride kernels cover the rest)."""
    return max(1, min(3, -(-count // threads))), threads

