"""What a measurement was taken from: the software and machine, the checkout's git state, and
the GPU's identity and clocks (NVML), so every stored row can be traced back.

NVML comes from nvidia-ml-py (`pynvml`) and the driver's libnvidia-ml; where either is missing
(a CPU-only machine) the GPU fields are null, never guessed.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from importlib import metadata

from .compile import nvrtc_version
from .nsys import find_nsys, nsys_version
from convsweep.base.paths import ROOT

PACKAGES = ("numpy", "cuda-core", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-ml-py", "nvtx",
            "sqlalchemy", "snakemake", "pyyaml")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state() -> dict:
    """{commit, dirty}: HEAD of the checkout and whether tracked or new files differ from it
    (ignored files, such as results and the database, do not count); nulls outside a git checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def environment(gpu=None, monitor: GpuMonitor | None = None) -> dict:
    """The software and machine a job ran on: the same for every run of a sweep on one host, so the
    store keeps one row of it. With a GPU: its identity (UUID, driver, from NVML: through `monitor`
    where the caller has one open, else a monitor of its own) and the nsys on PATH (or $NSYS), which
    profiles GPU runs."""
    host = host_environment()
    env = {**host, "packages": dict(host["packages"]), "gpu": None, "gpu_uuid": None, "compute_capability": None,
           "driver": None, "cuda_driver": None, "nsys": None}
    if gpu is not None:
        env.update(gpu=gpu.name, compute_capability=f"{gpu.compute_capability:.1f}", cuda_driver=gpu.driver_version())
        nsys = find_nsys()
        env["nsys"] = nsys_version(nsys) if nsys else None
        with nullcontext(monitor) if monitor is not None else GpuMonitor(gpu.uuid, gpu.pci_bus_id) as nvml:
            env.update(gpu_uuid=nvml.uuid, driver=nvml.driver)
    return env


@functools.cache
def host_environment() -> dict:
    """The host's part of environment(): Python, package versions, NVRTC. Reading the packages'
    metadata takes a job process about a tenth of a second, so it is read once, and a job reads it
    before it takes the GPU (the time it holds the GPU is the time other jobs wait)."""
    packages: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    env = {"hostname": platform.node(), "python": platform.python_version(), "packages": packages, "nvrtc": None}
    try:
        env["nvrtc"] = nvrtc_version()
    except Exception:  # no NVRTC library: the compile step says so where it matters
        pass
    return env


class GpuMonitor:
    """NVML's view of one CUDA device, found by UUID (or PCI bus id): its UUID, the driver version,
    the current clocks, what slows them down, and the energy counter. Every query returns None
    where NVML cannot answer."""

    def __init__(self, cuda_uuid: str | None, pci_bus_id: str | None = None):
        self._nvml = self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # no nvidia-ml-py, or no driver library
            return
        for find, key in ((pynvml.nvmlDeviceGetHandleByUUID, _nvml_uuid(cuda_uuid)),
                          (pynvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id)):
            if key:
                try:
                    self._handle = find(key)
                    return
                except pynvml.NVMLError:
                    continue

    def ask(self, query, *args):
        """NVML's answer to `query` (a pynvml function) about this GPU, or None where it has none."""
        if self._handle is None:
            return None
        try:
            value = query(self._handle, *args)
        except self._nvml.NVMLError:
            return None
        return value.decode() if isinstance(value, bytes) else value

    @property
    def uuid(self) -> str | None:
        return self.ask(self._nvml.nvmlDeviceGetUUID) if self._nvml else None

    @property
    def driver(self) -> str | None:
        if self._handle is None:
            return None
        assert self._nvml is not None  # the handle came from it
        try:
            version = self._nvml.nvmlSystemGetDriverVersion()
        except self._nvml.NVMLError:
            return None
        return version.decode() if isinstance(version, bytes) else version

    def clocks(self) -> dict:
        """{sm_mhz, memory_mhz} now (None where unknown)."""
        nvml = self._nvml
        if nvml is None:
            return {"sm_mhz": None, "memory_mhz": None}
        return {"sm_mhz": self.ask(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
                "memory_mhz": self.ask(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM)}

    def slowdowns(self) -> int | None:
        """The bits of SLOWDOWN_REASONS that hold the clocks down now (0: none), or None where NVML
        cannot tell. Idle, application clocks and sync boost are not slowdowns of a running kernel."""
        nvml = self._nvml
        if nvml is None:
            return None
        query = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = self.ask(query)
        return None if mask is None else int(mask) & sum(SLOWDOWN_REASONS)

    def energy_mj(self) -> int | None:
        """The GPU's energy counter in millijoules since the driver loaded (Volta and newer), or None."""
        return self.ask(self._nvml.nvmlDeviceGetTotalEnergyConsumption) if self._nvml else None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = self._handle = None

    def __enter__(self) -> GpuMonitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# NVML's clock event reasons that mean a kernel ran slower than the GPU's clocks allow (the bits
# of nvmlClocksEventReason*; the same values in every driver since NVML named them "throttle").
SLOWDOWN_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def slowdown_names(mask: int) -> list[str]:
    """The names of the reasons set in a SLOWDOWN_REASONS mask, in bit order."""
    return [name for bit, name in SLOWDOWN_REASONS.items() if mask & bit]


def gpu_uuids() -> list[str]:
    """NVML's UUIDs ('GPU-...') of this host's GPUs, in NVML's order; [] without NVML."""
    uuids = _each_gpu(lambda nvml, handle: nvml.nvmlDeviceGetUUID(handle)) or []
    return [u.decode() if isinstance(u, bytes) else u for u in uuids]


# What `arch: auto` compiles for where there is no GPU to ask: the lent H100's own target.
NO_GPU_ARCH = "sm_90a"


def own_arch(major: int, minor: int) -> str:
    """NVRTC's target for a GPU of compute capability major.minor, as `arch: auto` compiles for it: with the
    arch-specific features from Hopper on (sm_90a: wgmma, setmaxnreg), which bind the cubin to that one
    architecture, as a build for the GPU it runs on may."""
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def host_gpu_arch() -> str | None:
    """own_arch of this host's GPUs from NVML, without creating a CUDA context (compile jobs run beside
    timed ones); None without NVML or when the GPUs differ."""
    archs = set(_each_gpu(lambda nvml, handle: own_arch(*nvml.nvmlDeviceGetCudaComputeCapability(handle))) or [])
    return archs.pop() if len(archs) == 1 else None


def _each_gpu(query) -> list | None:
    """query(pynvml, handle) for each of this host's GPUs, in NVML's order; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return [query(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvml_uuid(cuda_uuid: str | None) -> str | None:
    """NVML names a GPU 'GPU-<uuid>'; CUDA gives the bare UUID."""
    if not cuda_uuid:
        return None
    return cuda_uuid if cuda_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{cuda_uuid}"


@dataclass(frozen=True)
class Machine:
    """What this machine offers a sweep's jobs: the GPUs CUDA sees (none: `no_gpu` says why, in the words a
    job would stop with), the NVIDIA driver, and the profilers a job would find."""

    devices: int  # CUDA devices visible to a job started here (CUDA_VISIBLE_DEVICES counts)
    no_gpu: str | None
    gpu_names: tuple[str, ...] = ()  # NVML's, one per GPU of the host; empty where NVML cannot tell
    driver: str | None = None  # the NVIDIA driver's version (NVML)
    nsys: str | None = None  # its version, or its path where the version cannot be read
    ncu: str | None = None  # its path

    def describe(self) -> str:
        """One line: the GPUs and driver (or why there is none), nsys, ncu."""
        if self.no_gpu:
            gpu = self.no_gpu
        else:
            names = sorted(set(self.gpu_names))
            counted = [f"{self.gpu_names.count(n)} x {n}" if self.gpu_names.count(n) > 1 else n for n in names]
            gpu = ", ".join(counted) or f"{self.devices} CUDA device{'s' * (self.devices != 1)}"
            if self.gpu_names and self.devices != len(self.gpu_names):
                gpu += f" ({self.devices} visible to CUDA)"
            gpu += f", driver {self.driver or 'unknown'}"
        return f"{gpu}; nsys: {self.nsys or 'not found'}; ncu: {self.ncu or 'not found'}"


def probe_machine(devices: Callable[[], int]) -> Machine:
    """What this machine has, asked without a CUDA context (cuInit, NVML, PATH), so the Snakemake process that
    asks never holds a GPU that a timed job wants. `devices`: gpu.count_devices (gpu sits above this module),
    or a test's stand-in."""
    from convsweep.base.errors import MachineError

    try:
        count, no_gpu = devices(), None
    except MachineError as e:
        count, no_gpu = 0, str(e)
    names, driver = _nvml_view() if count else ((), None)
    nsys = find_nsys()
    # ncu.find_ncu's lookup: that module sits below this one (docs/layout.md's package table).
    ncu = shutil.which(os.environ.get("NCU") or "ncu")
    return Machine(count, no_gpu, names, driver, (nsys_version(nsys) or nsys) if nsys else None, ncu)


def _nvml_view() -> tuple[tuple[str, ...], str | None]:
    """NVML's names of this host's GPUs and the driver's version; ((), None) without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, or no driver library
        return (), None
    try:
        names = tuple(_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                      for i in range(pynvml.nvmlDeviceGetCount()))
        return names, _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        return (), None
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
