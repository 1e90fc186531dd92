"""Peak rates and physical floors on the CPU: the table reproduces NVIDIA's datasheet numbers, an unknown
architecture gets the largest rates, each term of a floor binds when it should, and peaks_of reads a
stand-in device and monitor."""
from types import SimpleNamespace

import pytest

from convsweep.base.errors import DeviceError
from convsweep.device.peaks import (PER_SM_FLOPS_PER_CLOCK, UNITS, Peaks, flops_per_s, floor_ms, floor_rate,
                             forward_floor_ms, pcie_bytes_per_s, peaks_of)
from convsweep.device.provenance import GpuMonitor

T = 1e12


@pytest.mark.parametrize("cc, sm_count, mhz, datasheet", [
    ("9.0", 132, 1830, {"tf32": 494.7 * T, "fp16": 989.4 * T, "int8": 1978.9 * T}),  # H100 SXM5 (whitepaper)
    ("8.0", 108, 1410, {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "int8": 624 * T}),
    ("7.0", 80, 1530, {"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T}),  # V100 SXM2
    ("8.6", 84, 1800, {"tf32": 77.4 * T, "fp16": 154.8 * T}),  # RTX A6000
])
def test_the_table_reproduces_the_datasheets_within_one_percent(cc, sm_count, mhz, datasheet):
    rates = flops_per_s(cc, sm_count, mhz)
    for unit, peak in datasheet.items():
        assert rates[unit] == pytest.approx(peak, rel=0.01), unit


def test_an_unknown_architecture_gets_the_largest_rate_of_each_unit():
    rates = flops_per_s("99.0", 100, 1000)
    for unit in UNITS:
        largest = max(row[unit] for row in PER_SM_FLOPS_PER_CLOCK.values())
        assert rates[unit] == largest * 100 * 1000e6
        assert all(rates[unit] >= flops_per_s(cc, 100, 1000)[unit] for cc in PER_SM_FLOPS_PER_CLOCK)


def test_int8_is_the_fastest_dense_rate_of_every_architecture():
    for cc, row in PER_SM_FLOPS_PER_CLOCK.items():
        assert row["int8"] == max(row.values()), cc


def h100(pcie=63e9) -> Peaks:
    return Peaks(gpu="H100", compute_capability="9.0", sm_count=132, sm_clock_mhz=1830.0, dram_bytes_per_s=3.35e12,
                 l2_bytes=50 * 2**20, pcie_bytes_per_s=pcie, flops_per_s=flops_per_s("9.0", 132, 1830))


def test_compute_binds_for_many_flops_on_few_bytes():
    peaks = h100()
    flops = 10**13
    assert floor_ms(peaks, flops, 1000, "float32") == pytest.approx(flops / peaks.flops_per_s["int8"] * 1e3)


def test_dram_binds_for_many_bytes_and_bytes_that_fit_in_l2_cost_nothing():
    peaks = h100()
    streamed = 10**10
    assert floor_ms(peaks, 1000, peaks.l2_bytes + streamed, "float32") == pytest.approx(streamed / 3.35e12 * 1e3)
    assert floor_ms(peaks, 0, peaks.l2_bytes, "float32") == 0.0


def test_float64_is_held_to_fp64_and_the_rest_to_the_fastest_unit():
    peaks = h100()
    assert floor_rate(peaks, "float64") == peaks.flops_per_s["fp64"]
    assert floor_rate(peaks, "float32") == peaks.flops_per_s["int8"]
    assert floor_ms(peaks, 10**12, 0, "float64") == pytest.approx(10**12 / peaks.flops_per_s["fp64"] * 1e3)
    assert floor_ms(peaks, 10**12, 0, "float64") > 30 * floor_ms(peaks, 10**12, 0, "float32")


def test_the_forward_floor_is_the_input_over_pcie_where_that_is_longer():
    peaks = h100()
    input_bytes = 63 * 10**6  # 1 ms over 63 GB/s
    assert forward_floor_ms(peaks, 1000, 1000, input_bytes, "float32") == pytest.approx(1.0)
    heavy = 10**16  # device work far longer than the copy
    assert forward_floor_ms(peaks, heavy, 0, input_bytes, "float32") == floor_ms(peaks, heavy, 0, "float32")
    assert forward_floor_ms(h100(pcie=None), 1000, 1000, input_bytes, "float32") == floor_ms(
        peaks, 1000, 1000, "float32")


def test_pcie_rates_per_direction():
    assert pcie_bytes_per_s(5, 16) == pytest.approx(63.0e9, rel=0.001)
    assert pcie_bytes_per_s(4, 16) == pytest.approx(31.5e9, rel=0.001)
    assert pcie_bytes_per_s(3, 8) == pytest.approx(7.88e9, rel=0.001)
    assert pcie_bytes_per_s(None, 16) is None and pcie_bytes_per_s(9, 16) is None and pcie_bytes_per_s(5, 0) is None


def test_peaks_round_trip_through_json():
    peaks = h100()
    assert Peaks.from_json(peaks.to_json()) == peaks
    assert Peaks.from_json(h100(pcie=None).to_json()).pcie_bytes_per_s is None
    assert Peaks.from_json({**peaks.to_json(), "later_field": 1}) == peaks


def stand_in_gpu(clock_khz=1_980_000, memory_khz=2_619_000, integrated=None):
    """An H100 SXM as cuda.core describes it: kHz clocks, bus width in bits, L2 in bytes."""
    props = SimpleNamespace(multiprocessor_count=132, clock_rate=clock_khz, memory_clock_rate=memory_khz,
                            global_memory_bus_width=5120, l2_cache_size=50 * 2**20)
    if integrated is not None:
        props.integrated = integrated
    device = SimpleNamespace(properties=props, compute_capability=SimpleNamespace(major=9, minor=0))
    return SimpleNamespace(name="NVIDIA H100 80GB HBM3", device=device)


class StandInMonitor:
    """Answers NVML queries by pynvml function name (a provenance.GpuMonitor's `ask`); None: cannot tell."""

    def __init__(self, **answers):
        self.answers, self.asked = answers, []

    def ask(self, query, *args):
        self.asked.append(query.__name__)
        answer = self.answers.get(query.__name__)
        return answer(*args) if callable(answer) else answer


def test_peaks_of_reads_the_device_attributes():
    peaks = peaks_of(stand_in_gpu())
    assert (peaks.gpu, peaks.compute_capability, peaks.sm_count, peaks.sm_clock_mhz) == (
        "NVIDIA H100 80GB HBM3", "9.0", 132, 1980.0)
    assert peaks.dram_bytes_per_s == pytest.approx(3.35e12, rel=0.001)  # H100 SXM's 3.35 TB/s
    assert peaks.l2_bytes == 50 * 2**20 and peaks.pcie_bytes_per_s is None
    assert peaks.flops_per_s == flops_per_s("9.0", 132, 1980.0)


def test_peaks_of_takes_the_pcie_link_and_the_higher_clock_from_nvml():
    import pynvml

    clocks = {pynvml.NVML_CLOCK_SM: 2100, pynvml.NVML_CLOCK_MEM: 2619}
    monitor = StandInMonitor(nvmlDeviceGetMaxPcieLinkGeneration=5, nvmlDeviceGetMaxPcieLinkWidth=16,
                             nvmlDeviceGetMaxClockInfo=lambda domain: clocks[domain],
                             nvmlDeviceGetC2cModeInfoV=SimpleNamespace(isC2cEnabled=0))
    peaks = peaks_of(stand_in_gpu(), monitor)
    assert peaks.pcie_bytes_per_s == pytest.approx(63.0e9, rel=0.001)
    assert peaks.sm_clock_mhz == 2100.0  # the rates err high, never low
    assert peaks.dram_bytes_per_s == pytest.approx(3.35e12, rel=0.001)


def test_no_pcie_term_where_the_host_link_is_not_pcie():
    c2c = StandInMonitor(nvmlDeviceGetMaxPcieLinkGeneration=5, nvmlDeviceGetMaxPcieLinkWidth=16,
                         nvmlDeviceGetC2cModeInfoV=SimpleNamespace(isC2cEnabled=1))
    assert peaks_of(stand_in_gpu(), c2c).pcie_bytes_per_s is None  # Grace Hopper: NVLink-C2C to the host
    pcie = StandInMonitor(nvmlDeviceGetMaxPcieLinkGeneration=5, nvmlDeviceGetMaxPcieLinkWidth=16)
    assert peaks_of(stand_in_gpu(integrated=True), pcie).pcie_bytes_per_s is None  # host memory is its memory


def test_a_monitor_that_found_no_gpu_leaves_pcie_unknown():
    with GpuMonitor(None, None) as monitor:
        assert peaks_of(stand_in_gpu(), monitor).pcie_bytes_per_s is None


def test_a_clock_neither_the_device_nor_nvml_tells_is_an_error():
    with pytest.raises(DeviceError, match="SM clock"):
        peaks_of(stand_in_gpu(clock_khz=0))
    with pytest.raises(DeviceError, match="memory clock"):
        peaks_of(stand_in_gpu(memory_khz=0), StandInMonitor())
