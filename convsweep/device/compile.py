"""Run-time compilation of kernels with NVRTC (through cuda.core), cached on disk.

The cache key covers everything that changes the machine code: the source and the headers it
can include, the options (tunables as -D macros), the target architecture and the NVRTC
version. A hit skips NVRTC entirely, which is what keeps a cached job fast. An entry is one sealed
file (fileio.SealedCache: the cubin and its metadata under one digest and HMAC): a changed cubin,
register count or finding is removed and built again, never run or recorded.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from convsweep.base.fileio import SealedCache, canonical_hash
from convsweep.base.errors import CompileError
from .findings import scan_ptx
from convsweep.base.paths import KERNELS_DIR, cache_dir, relative_to_root
from convsweep.model.variants import ConvShape, Variant, find_variant, load_registry


_ERROR_LINE = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<msg>.*)$", re.M)
_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
LAYERS_SOURCE = KERNELS_DIR / "layers.cu"  # relu, max-pool and dense: every GPU job runs them
CACHE_FORMAT = "findings-1"  # what a cached build's metadata holds: builds cached before findings are made again
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(?P<name>[^"]+)"', re.M)


@dataclass(frozen=True)
class KernelResources:
    name: str
    registers: int
    shared_bytes: int
    local_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


@dataclass(frozen=True)
class CompiledModule:
    """One compiled module: the cubin plus what the store records about it."""

    name: str  # variant name, or the file stem for non-variant modules (layers)
    source: str  # path relative to the repository
    params: dict
    arch: str
    options_hash: str
    source_hash: str
    cubin: bytes = field(repr=False)
    compile_ms: float
    cache_hit: bool
    log: str
    kernels: tuple[KernelResources, ...]
    # kernel -> what its PTX does that a convolution has no need to (convsweep.device.findings); {} for none
    findings: dict[str, list[str]] = field(default_factory=dict)

    def record(self) -> dict:
        """The JSON-able part, as the result file stores it."""
        d = asdict(self)
        d.pop("cubin")
        d["variant"] = d.pop("name")
        d["kernels"] = [asdict(k) for k in self.kernels]
        return d


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=1)
def _cuda_include_dirs() -> tuple[str, ...]:
    """CUDA's headers (cuda_fp16.h, mma.h) from a wheel or toolkit, when one is installed.

    Wheels split them: cuda_runtime.h and mma.h come with the runtime, mma.h's crt/ part with
    nvidia-cuda-crt, possibly in another site directory; every nvidia/cu*/include that holds
    crt/ is added after the runtime's directory.
    """
    dirs = []
    try:
        from cuda import pathfinder

        dirs.append(pathfinder.find_nvidia_header_directory("cudart"))
    except Exception:
        pass
    try:
        import nvidia

        for root in nvidia.__path__:
            dirs += [str(d.parent) for d in sorted(Path(root).glob("cu*/include/crt"))]
    except ImportError:
        pass
    return tuple(dict.fromkeys(d for d in dirs if d))


def _sources_with_text(source: Path) -> dict[Path, str]:
    """The .cu file and every header of the checkout it includes ("..."), transitively, each read once."""
    found: dict[Path, str] = {}
    todo = [Path(source).resolve()]
    while todo:
        path = todo.pop(0)
        if path in found:
            continue
        found[path] = path.read_text(encoding="utf-8", errors="replace")
        for match in _QUOTED_INCLUDE.finditer(found[path]):
            header = (path.parent / match["name"]).resolve()
            if header.is_file():  # others come from NVRTC's include path (CUDA's headers)
                todo.append(header)
    return found


def kernel_sources(source: Path) -> tuple[Path, ...]:
    """All a build depends on besides its options: the .cu file and the checkout headers it
    includes, transitively. Snakemake watches these files; the source hash covers them."""
    return tuple(_sources_with_text(source))


def source_hash(source: Path) -> str:
    """sha256 over the names and text of kernel_sources(source): changes exactly when the code does."""
    return canonical_hash([[relative_to_root(p), text] for p, text in _sources_with_text(source).items()])


def build_arch(source: Path, name: str, arch: str) -> str:
    """`arch`, for a build of `name` from `source`, once the registered variant of that name and source has
    allowed it (Variant.build_arch: a one-line CompileError for a target its registry arch rules out, sm_90
    for a wgmma kernel); any other module (layers.cu) builds for any target."""
    variant = find_variant(name)  # a registry's, or a joined class's (a student's arch list holds too)
    if variant is None or variant.source is None or Path(variant.source).resolve() != Path(source).resolve():
        return arch
    return variant.build_arch(arch)


def compile_source(source: Path, name: str, params: dict, arch: str) -> CompiledModule:
    """Compile one .cu file for `arch` (e.g. sm_90a; one its registered variant allows: build_arch) with
    `params` as macros; cached on disk."""
    source = Path(source)
    prebuilt = _PREBUILT.get()
    if prebuilt is not None and (found := prebuilt.get(BuildRequest.of(source, name, params).key(arch))) is not None:
        if isinstance(found, CompileError):
            raise found
        return found
    arch = build_arch(source, name, arch)
    defines = [(k, str(v)) for k, v in sorted(params.items())]
    include_dirs = _cuda_include_dirs()
    option_record = {"arch": arch, "defines": defines, "std": "c++17", "lineinfo": True,
                     "ptxas": ["-v"], "cuda_headers": bool(include_dirs)}
    options_hash = canonical_hash(option_record)
    sources_hash = source_hash(source)
    key = canonical_hash([sources_hash, options_hash, nvrtc_version(), CACHE_FORMAT])
    cached = _load_cached(key)
    if cached:
        meta, cubin, kernels = cached
        return CompiledModule(name, relative_to_root(source), dict(params), arch, options_hash, sources_hash, cubin,
                              meta["compile_ms"], True, meta["log"], kernels, meta["findings"])

    start = time.perf_counter()
    cubin, ptx, text = cast(tuple[bytes, str, str],  # the cubin, asked for
                            _nvrtc(source, name, _options(source, arch, defines, include_dirs), cubin=True))
    compile_ms = (time.perf_counter() - start) * 1e3
    kernels, findings = parse_ptxas_log(text), scan_ptx(ptx)
    _store_cached(key, cubin, {"compile_ms": compile_ms, "log": text, "kernels": [asdict(k) for k in kernels],
                               "findings": findings})
    return CompiledModule(name, relative_to_root(source), dict(params), arch, options_hash, sources_hash, cubin,
                          compile_ms, False, text, kernels, findings)


def _nvrtc(source: Path, name: str, options, cubin: bool) -> tuple[bytes | None, str, str]:
    """One NVRTC compilation of `source` with `options` (ProgramOptions): (the cubin where asked, the PTX,
    the compiler's log). Through cuda.bindings' NVRTC, which needs no driver; a real target (sm_XX) gives
    both the PTX and the machine code of one compilation. A failure is a CompileError with the first line."""
    from cuda.bindings import nvrtc

    flags = [flag for flag in options.as_bytes("nvrtc") if cubin or not flag.startswith(b"--ptxas-options")]
    _, program = nvrtc.nvrtcCreateProgram(source.read_bytes(), relative_to_root(source).encode(), 0, [], [])
    try:
        (result,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        # NVRTC writes into the buffer it is handed: a bytearray, never `b" " * size`, which for size 1 (an
        # empty log, or PTX, is its NUL alone) is CPython's one shared b" ", and NVRTC's NUL would then turn
        # every b" " of the process into b"\0".
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.rstrip(b"\0").decode(errors="replace").replace("\x00", "").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(_first_error(text, relative_to_root(source), name), log=text)
        _, size = nvrtc.nvrtcGetPTXSize(program)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(program, ptx)
        code: bytes | None = None
        if cubin:
            _, size = nvrtc.nvrtcGetCUBINSize(program)
            written = bytearray(size)
            nvrtc.nvrtcGetCUBIN(program, written)
            code = bytes(written)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return code, ptx.rstrip(b"\0").decode(), text


def _options(source: Path, arch: str, defines: list, include_dirs: tuple[str, ...]):
    from cuda.core import ProgramOptions

    return ProgramOptions(
        name=relative_to_root(source), arch=arch, std="c++17", lineinfo=True, ptxas_options=["-v"],
        # NVRTC's own cache (12.9+) hands back a build without ptxas' log (cuda-python issue 1124): off, per
        # call, as NVIDIA's Fuser does; convsweep keeps its own cache of builds with their resources.
        no_cache=True,
        define_macro=defines or None,
        include_path=[str(source.parent), *include_dirs],
        use_bundled_headers=not include_dirs and nvrtc_version() >= "13.3",
    )


def compile_ptx(source: Path, name: str, params: dict, arch: str) -> str:
    """The PTX NVRTC makes of what compile_source builds (same target and options), uncached: for
    reading which instructions a kernel asks for (wgmma, mma.sync)."""
    source = Path(source)
    defines = [(k, str(v)) for k, v in sorted(params.items())]
    options = _options(source, build_arch(source, name, arch), defines, _cuda_include_dirs())
    return _nvrtc(source, name, options, cubin=False)[1]


# The builds of the job being measured, by cache key (compile_all fills it): a CompiledModule, or
# the CompileError a source gave, so a setting whose build failed fails at once without recompiling.
_PREBUILT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("prebuilt", default=None)


@dataclass(frozen=True)
class BuildRequest:
    """One module to build: a .cu file, the name its records use, and its macros (sorted pairs)."""

    source: Path
    name: str
    macros: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, source: Path, name: str, params: dict) -> BuildRequest:
        return cls(Path(source).resolve(), name, tuple(sorted(params.items())))

    def key(self, arch: str) -> tuple:
        return (self.source, self.name, tuple((k, str(v)) for k, v in self.macros), arch)


def build_workers() -> int:
    """The CPU cores this process may use (its affinity: what SLURM or taskset gave it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class PendingBuilds:
    """A job's builds compiling on worker threads (compile_all yields one)."""

    def __init__(self, futures: dict, arch: str):
        self._token: contextvars.Token | None  # _PREBUILT's value set by wait, until _release
        self._futures, self._arch, self._token = futures, arch, None

    def wait(self) -> dict[BuildRequest, CompiledModule | CompileError]:
        """Every build's result; from now until the compile_all block ends, compile_source returns
        these builds (or raises their error) without NVRTC or the disk."""
        results = {request: future.result() for request, future in self._futures.items()}
        if self._token is None:
            by_key = {request.key(self._arch): result for request, result in results.items()}
            self._token = _PREBUILT.set({**(_PREBUILT.get() or {}), **by_key})
        return results

    def _release(self) -> None:
        if self._token is not None:
            _PREBUILT.reset(self._token)
            self._token = None


@contextlib.contextmanager
def compile_all(requests: list[BuildRequest], arch: str, workers: int | None = None):
    """Start compiling every request on `workers` threads (NVRTC works outside the GIL), through
    the disk cache as ever, and yield at once, so the caller can go on meanwhile; the PendingBuilds
    yielded waits for them."""

    def build(request: BuildRequest):
        try:
            return compile_source(request.source, request.name, dict(request.macros), arch)
        except CompileError as e:
            return e

    # cuda.core loads its modules lazily, and two threads importing them at once can each see a
    # half-made module: load what the workers and the caller (opening its GPU later) use, first, here.
    import cuda.core

    _ = cuda.core.Device, cuda.core.Program, cuda.core.ProgramOptions, nvrtc_version(), _cuda_include_dirs()
    load_registry()  # build_arch reads it: validated here, once, not by several workers at once
    requests = list(dict.fromkeys(requests))
    pool = ThreadPoolExecutor(max_workers=min(workers or build_workers(), max(1, len(requests))))
    pending = PendingBuilds({request: pool.submit(build, request) for request in requests}, arch)
    try:
        yield pending
    finally:
        pool.shutdown(cancel_futures=True)
        pending._release()


def compile_variant(variant: Variant, params: dict, arch: str, shape: ConvShape | None = None) -> CompiledModule:
    """Compile a variant; `shape` is needed only by variants that fix shape values at compile time."""
    return compile_source(cast(Path, variant.source), variant.name, variant.defines(params, shape), arch)  # a GPU one


def _first_error(text: str, source: str, name: str) -> str:
    match = _ERROR_LINE.search(text)
    if match:
        return f"{match['file']}:{match['line']}: {match['msg'].strip()} (variant '{name}', NVRTC)"
    # Not the compiler front end: ptxas (registers, shared memory) says "ptxas error : ..."
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\berror\b", line) and "NVRTC_ERROR" not in line]
    return f"{source}: NVRTC failed for variant '{name}': {(errors or lines or [text])[0]}"


def parse_ptxas_log(text: str) -> tuple[KernelResources, ...]:
    """Registers, shared memory and local memory per entry point from `ptxas -v` output."""
    frame: tuple[int, ...]
    kernels, current, frame = [], None, (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current, frame = m["name"], (0, 0, 0)
        elif (m := _FRAME.search(line)) and current:
            frame = tuple(int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current:
            kernels.append(KernelResources(current, int(m[1]), int(m[2] or 0), frame[0], frame[1], frame[2]))
            current = None
    return tuple(kernels)


def _build_entry(key: str) -> str:
    return f"kernels/{key}.sealed"


def _load_cached(key: str) -> tuple[dict, bytes, tuple[KernelResources, ...]] | None:
    """A build's metadata, cubin and kernels from the disk cache, where its entry is sound (else removed)."""
    cache = SealedCache(cache_dir())
    found = cache.read(_build_entry(key), key)
    if found is None:
        return None
    meta, cubin = found
    try:
        if not {"compile_ms", "log", "findings"} <= meta.keys():
            raise KeyError("compile_ms, log or findings")
        kernels = tuple(KernelResources(**k) for k in meta["kernels"])
    except (KeyError, TypeError, AttributeError):  # sealed with this user's secret, not as _store_cached seals a build
        cache.discard(_build_entry(key))
        return None
    return meta, bytes(cubin), kernels


def _store_cached(key: str, cubin: bytes, meta: dict) -> None:
    SealedCache(cache_dir()).write(_build_entry(key), key, meta, cubin)
