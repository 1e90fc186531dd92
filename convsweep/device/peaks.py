"""A device's peak rates and the physical floor they put under a time: work cannot finish faster than its
FLOPs at the fastest unit that could compute them, nor than its bytes at the DRAM's (or the host link's)
theoretical rate. Every rate here errs high, so a floor errs low: a floor may let a wrong time pass, but
must never flag an honest kernel.

The rates come from the device's attributes (cuda.core `Device.properties`), NVML where a monitor is open,
and a table of dense FLOP per clock per SM by architecture.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from convsweep.base.errors import DeviceError

UNITS = ("fp64", "fp32", "tf32", "fp16", "int8")

# Dense FLOP (or integer op) per clock per SM, by compute capability, in UNITS order:
#   fp64: FP64 tensor core where the architecture has one (8.0, 9.0), else FP64 FMA on the CUDA cores;
#   fp32: FP32 FMA on the CUDA cores; tf32: TF32 tensor (the fp32 rate where there is no TF32 unit);
#   fp16: FP16 tensor with FP32 accumulate at the full (data-centre / professional card) rate;
#   int8: the fastest dense tensor rate, INT8 or FP8 (FP16 on Volta, which has no INT8 tensor unit).
# Sources: FP32/FP64 FMA from the CUDA C++ Programming Guide's arithmetic-instruction throughput table
# (results per clock per SM, one FMA = 2 FLOP); tensor rates from NVIDIA's whitepapers, the per-GPU peak
# divided by SMs x boost clock: "Tesla V100 GPU Architecture" (V100: 125 TFLOP/s fp16, 80 SMs, 1530 MHz),
# "Turing GPU Architecture" and the T4 datasheet (65 fp16 / 130 int8, 40 SMs, 1590 MHz), "A100 Tensor Core
# GPU Architecture" (A100: 19.5 fp64 tensor, 156 tf32, 312 fp16, 624 int8, 108 SMs, 1410 MHz), "Ampere GA102
# GPU Architecture" (RTX A6000: 77.4 tf32, 154.8 fp16, 84 SMs, 1800 MHz), "Ada GPU Architecture" (RTX 6000
# Ada: 728.5 fp8, 142 SMs, 2505 MHz), "H100 Tensor Core GPU Architecture" (H100 SXM5: 494.7 tf32, 989.4 fp16,
# 1978.9 fp8, 132 SMs, 1830 MHz) and the Blackwell technical brief / HGX B200 datasheet (B200: 1.1 PFLOP/s
# tf32, 2.25 fp16, 4.5 fp8 dense, 148 SMs: twice Hopper's per-SM tensor rates; FP64 at half FP32).
PER_SM_FLOPS_PER_CLOCK: dict[str, dict[str, int]] = {
    "7.0": {"fp64": 64, "fp32": 128, "tf32": 128, "fp16": 1024, "int8": 1024},
    "7.5": {"fp64": 4, "fp32": 128, "tf32": 128, "fp16": 1024, "int8": 2048},
    "8.0": {"fp64": 128, "fp32": 128, "tf32": 1024, "fp16": 2048, "int8": 4096},
    "8.6": {"fp64": 4, "fp32": 256, "tf32": 512, "fp16": 1024, "int8": 2048},
    "8.9": {"fp64": 4, "fp32": 256, "tf32": 512, "fp16": 1024, "int8": 2048},
    "9.0": {"fp64": 256, "fp32": 256, "tf32": 2048, "fp16": 4096, "int8": 8192},
    "10.0": {"fp64": 128, "fp32": 256, "tf32": 4096, "fp16": 8192, "int8": 16384},
}

# PCIe generation -> (transfer rate per lane in GT/s, payload bits per transferred bit): 8b/10b for gens 1-2,
# 128b/130b for 3-5, and gen 6's FLIT (242 of 256 bytes carry data). A generation not here leaves the link
# rate unknown rather than guessed.
PCIE_LANE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130),
             6: (64.0, 242 / 256)}


@dataclass(frozen=True)
class Peaks:
    """What one device can do at most: SMs and their top clock, the DRAM's and the host link's theoretical
    bytes/s (PCIe per direction; None where NVML cannot tell or the host link is not PCIe), the L2 size, and
    the dense peak FLOP/s of each unit in UNITS."""

    gpu: str
    compute_capability: str  # "9.0"
    sm_count: int
    sm_clock_mhz: float  # the highest SM clock the device reports
    dram_bytes_per_s: float
    l2_bytes: int
    pcie_bytes_per_s: float | None
    flops_per_s: dict[str, float]

    def to_json(self) -> dict:
        """A plain dict, as stored in a result file under integrity.peaks."""
        return {**asdict(self), "flops_per_s": dict(self.flops_per_s)}

    @classmethod
    def from_json(cls, data: dict) -> Peaks:
        """The peaks a result file stored (keys it does not know are left out)."""
        values = {f.name: data[f.name] for f in fields(cls)}
        return cls(**{**values, "flops_per_s": {unit: float(rate) for unit, rate in data["flops_per_s"].items()}})


def per_sm_rates(compute_capability: str) -> dict[str, int]:
    """The table's FLOP per clock per SM for an architecture; for one not in the table (most likely a newer
    one), the largest of each unit over the table, so that its floors err low rather than high."""
    if compute_capability in PER_SM_FLOPS_PER_CLOCK:
        return dict(PER_SM_FLOPS_PER_CLOCK[compute_capability])
    return {unit: max(rates[unit] for rates in PER_SM_FLOPS_PER_CLOCK.values()) for unit in UNITS}


def flops_per_s(compute_capability: str, sm_count: int, sm_clock_mhz: float) -> dict[str, float]:
    """The dense peak of each unit: FLOP per clock per SM x SMs x clock."""
    return {unit: float(per_clock) * sm_count * sm_clock_mhz * 1e6
            for unit, per_clock in per_sm_rates(compute_capability).items()}


def dram_bytes_per_s(memory_clock_mhz: float, bus_width_bits: int) -> float:
    """The theoretical DRAM rate: two transfers per memory clock (the clock as the device and NVML report it,
    for HBM and GDDR alike) over the whole bus."""
    return 2 * memory_clock_mhz * 1e6 * bus_width_bits / 8


def pcie_bytes_per_s(generation: int | None, width: int | None) -> float | None:
    """One direction's theoretical rate of a PCIe link, or None for an unknown generation or width."""
    if not generation or not width or generation not in PCIE_LANE:
        return None
    gigatransfers, efficiency = PCIE_LANE[generation]
    return gigatransfers * 1e9 * efficiency / 8 * width


def _nvml(monitor, query: str, *constants: str):
    """NVML's answer to pynvml.<query>(handle, pynvml.<constant>...) through the monitor's own device handle
    (provenance.GpuMonitor.ask); None without a monitor or nvidia-ml-py, or where NVML cannot answer."""
    if monitor is None:
        return None
    try:
        import pynvml
    except ImportError:
        return None
    return monitor.ask(getattr(pynvml, query), *(getattr(pynvml, name) for name in constants))


def _nvml_clock_mhz(monitor, domain: str) -> float | None:
    """NVML's highest clock of one domain ("SM" or "MEM") in MHz."""
    mhz = _nvml(monitor, "nvmlDeviceGetMaxClockInfo", f"NVML_CLOCK_{domain}")
    return float(mhz) if mhz else None


def host_link_bytes_per_s(monitor, integrated: bool) -> float | None:
    """The PCIe rate the host's data crosses, from the link generation and width both the GPU and the
    system support. None where that is not the host path: an integrated GPU shares the host's memory, and
    a GPU on NVLink-C2C (Grace Hopper) reaches the host far faster than its PCIe figures say."""
    if integrated:
        return None
    c2c = _nvml(monitor, "nvmlDeviceGetC2cModeInfoV")
    if c2c is not None and getattr(c2c, "isC2cEnabled", False):
        return None
    return pcie_bytes_per_s(_nvml(monitor, "nvmlDeviceGetMaxPcieLinkGeneration"),
                            _nvml(monitor, "nvmlDeviceGetMaxPcieLinkWidth"))


def peaks_of(gpu, monitor=None) -> Peaks:
    """The peaks of a convsweep.device.gpu.Gpu (or a stand-in with `name` and a cuda.core-like `device`), with
    NVML's highest clocks and PCIe link through `monitor` (a provenance.GpuMonitor) where one is open.
    DeviceError where neither the device nor NVML tells a clock: a floor without it would be a guess."""
    props, cc = gpu.device.properties, gpu.device.compute_capability
    compute_capability = f"{cc.major}.{cc.minor}"
    sm_clock_mhz = max(props.clock_rate / 1e3, _nvml_clock_mhz(monitor, "SM") or 0)
    memory_clock_mhz = max(props.memory_clock_rate / 1e3, _nvml_clock_mhz(monitor, "MEM") or 0)
    for domain, mhz in (("SM", sm_clock_mhz), ("memory", memory_clock_mhz)):
        if not mhz:
            raise DeviceError(f"{gpu.name}: neither the device nor NVML tells its {domain} clock, "
                              "so no physical floor can be set")
    sm_count = int(props.multiprocessor_count)
    return Peaks(
        gpu=str(gpu.name), compute_capability=compute_capability, sm_count=sm_count, sm_clock_mhz=sm_clock_mhz,
        dram_bytes_per_s=dram_bytes_per_s(memory_clock_mhz, int(props.global_memory_bus_width)),
        l2_bytes=int(props.l2_cache_size),
        pcie_bytes_per_s=host_link_bytes_per_s(monitor, bool(getattr(props, "integrated", False))),
        flops_per_s=flops_per_s(compute_capability, sm_count, sm_clock_mhz))


def floor_rate(peaks: Peaks, dtype) -> float:
    """The fastest FLOP/s that could compute a network of `dtype`: fp64 for float64; for any other the
    fastest unit of all, since a variant may reach a looser class's accuracy on any unit (3xTF32 or split
    FP16 for fp32 results)."""
    if np.dtype(dtype) == np.float64:
        return peaks.flops_per_s["fp64"]
    return max(peaks.flops_per_s.values())  # int8's, by the table's construction


def floor_ms(peaks: Peaks, flops: int, min_bytes: int, dtype) -> float:
    """The least time the work can take on the device: its FLOPs at floor_rate, or the bytes that cannot
    stay in L2 at the DRAM's rate, whichever is longer (bytes that fit in L2 may never reach DRAM)."""
    compute_s = flops / floor_rate(peaks, dtype)
    memory_s = max(0, min_bytes - peaks.l2_bytes) / peaks.dram_bytes_per_s
    return max(compute_s, memory_s) * 1e3


def forward_floor_ms(peaks: Peaks, total_flops: int, min_bytes: int, input_bytes: int, dtype) -> float:
    """The least time of a host-to-host forward pass: its device work's floor, or the input crossing the
    host link, whichever is longer (the link's term left out where its rate is unknown)."""
    device_ms = floor_ms(peaks, total_flops, min_bytes, dtype)
    if peaks.pcie_bytes_per_s is None:
        return device_ms
    return max(device_ms, input_bytes / peaks.pcie_bytes_per_s * 1e3)
