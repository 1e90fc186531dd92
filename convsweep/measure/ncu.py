"""Nsight Compute: the evidence a report cites for each conv kernel (throughput against peak,
occupancy and what limits it, cache hit rates, DRAM traffic, FLOPs, warp stalls), and one line
saying what bounds it.

A profile job runs a job's settings once each (no warm-up, one pass) in a child process under
`ncu`, with the conv kernels of its variants selected by name and NVTX recorded, so each profiled
launch is attributed to its setting and layer through the ranges the job pushes ("setting 2" >
"repeat 0" > "chunk 0" > "conv1"). It never runs inside a timed job: ncu replays each kernel many
times and would own the timings.

Where ncu cannot profile (no permission for the GPU's counters, ERR_NVGPUCTRPERM) the job writes a
`skipped` file with the reason and the sweep goes on: that is a fact about this GPU's settings, worth
storing beside its runs. Without ncu, or without a GPU, the machine lacks what the experiment asked
for (`ncu: true`): MachineError, no file, and the job fails until the machine has it. `ncu: auto`
profiles where ncu is found, and elsewhere writes a `skipped` file saying ncu is not there.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from convsweep.sweep.config import JobSpec
from convsweep.base.errors import MachineError, writing
from convsweep.device.gpulock import bind_free_gpu
from .job import no_result_on_machine_error, read_progress
from convsweep.device.provenance import git_state
from .files import PROFILE_FORMAT, ProfiledLaunch, ProfiledSetting, ProfileFile
from .record import Measurement, utc_now
from convsweep.model.variants import get_variant

# A pass under ncu replays each profiled kernel once per group of metrics and saves and restores the memory it
# writes between replays: many times its timed length. Its deadline is the experiment's times this.
NCU_DEADLINE_FACTOR = 10
DOMAIN = "convsweep"  # the NVTX domain of the job's ranges (runner.nvtx_range)
# Sections of Nsight Compute's own set that hold the metrics below (checked with ncu 2025.3.1).
SECTIONS = ("LaunchStats", "Occupancy", "SpeedOfLight", "SpeedOfLight_RooflineChart", "MemoryWorkloadAnalysis",
            "ComputeWorkloadAnalysis", "WarpStateStats")
# What is stored per kernel launch: our name -> ncu's metric. A metric a GPU or ncu version does not
# report is stored as null.
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers": "launch__registers_per_thread",
    "static_shared_bytes": "launch__shared_mem_per_block_static",
    "dynamic_shared_bytes": "launch__shared_mem_per_block_dynamic",
    "block_size": "launch__block_size",
    "grid_size": "launch__grid_size",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "blocks_limit_registers": "launch__occupancy_limit_registers",
    "blocks_limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "blocks_limit_warps": "launch__occupancy_limit_warps",
    "blocks_limit_sm": "launch__occupancy_limit_blocks",
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
}
# FLOPs executed on the CUDA cores, as the roofline section counts them (an FMA is two); tensor-core
# work is not in these counters: tensor_pipe_pct says how busy that pipe was.
FLOP_COUNTERS = {f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": 2 if op == "fma" else 1
                 for p in ("f", "h", "d") for op in ("fma", "add", "mul")}
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
# What limits occupancy: the launch's blocks-per-SM limit of each resource, the smallest wins.
_LIMITERS = {"blocks_limit_registers": "registers", "blocks_limit_shared_mem": "shared memory",
             "blocks_limit_warps": "warps per block", "blocks_limit_sm": "blocks per SM"}
BOUND_PCT = 60.0  # a unit this busy (% of its peak) is what bounds the kernel


def find_ncu() -> str | None:
    """$NCU, else `ncu` on PATH, where it is an executable file; None otherwise."""
    return shutil.which(os.environ.get("NCU") or "ncu")


# -- what a launch says -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LaunchProfile:
    """One profiled launch of a conv kernel: where it ran (setting, layer) and what ncu measured."""

    setting: int
    layer: str
    kernel: str
    launch: int  # its order among this setting and layer's launches of this kernel
    metrics: dict
    stalls: list[dict]  # [{reason, share}], the largest first

    @property
    def limiter(self) -> str | None:
        """What limits occupancy: the resource whose blocks-per-SM limit is lowest (None when unknown)."""
        limits: dict[str, Any] = {name: self.metrics.get(key) for key, name in _LIMITERS.items()
                                  if self.metrics.get(key) is not None}
        return min(limits, key=limits.__getitem__) if limits else None

    @property
    def bound(self) -> str:
        """One line on what bounds the kernel: the busiest unit when one is near its peak, else the
        latency it cannot hide (occupancy, its limiter, the top stall, or too few blocks)."""
        m = self.metrics
        dram, memory, sm = m.get("dram_pct"), m.get("memory_pct"), m.get("sm_pct")
        if dram is not None and dram >= BOUND_PCT and dram >= (sm or 0):
            return f"memory-bound: DRAM {dram:.0f}% of peak"
        if memory is not None and memory >= BOUND_PCT and memory >= (sm or 0):
            return f"memory-bound: L1/L2 {memory:.0f}% of peak (DRAM {dram or 0:.0f}%)"
        if sm is not None and sm >= BOUND_PCT:
            tensor = m.get("tensor_pipe_pct")
            return f"compute-bound: SM {sm:.0f}% of peak" + (f", tensor pipe {tensor:.0f}%" if tensor else "")
        parts = []
        waves = m.get("waves_per_sm")
        if waves is not None and waves < 1:
            parts.append(f"{waves:.2f} waves: too few blocks to fill the GPU")
        occupancy = m.get("achieved_occupancy_pct")
        if occupancy is not None:
            parts.append(f"{occupancy:.0f}% occupancy" + (f", {self.limiter}" if self.limiter else ""))
        if self.stalls:
            parts.append(f"stalls {self.stalls[0]['reason']} {100 * self.stalls[0]['share']:.0f}%")
        return "latency: " + "; ".join(parts) if parts else "unknown: ncu reported no throughput"

    def profiled(self) -> ProfiledLaunch:
        """The launch as the profile file holds it."""
        return ProfiledLaunch(setting=self.setting, layer=self.layer, kernel=self.kernel, launch=self.launch,
                              metrics=self.metrics, stalls=self.stalls, limiter=self.limiter, bound=self.bound)

    def record(self) -> dict:
        """The launch as the profile file's JSON holds it."""
        return self.profiled().to_json()


def launch_metrics(action) -> tuple[dict, list[dict]]:
    """The fixed metric set of one ncu_report action (None where it has no value), FLOPs executed,
    and the warp stall reasons with their share of all stalls."""
    def value(name: str):
        metric = action.metric_by_name(name)
        if metric is None:
            return None
        try:
            return metric.as_double()
        except Exception:  # a string-valued or empty metric
            return None

    metrics = {key: value(name) for key, name in METRICS.items()}
    counts = {name: value(name) for name in FLOP_COUNTERS}
    metrics["flops"] = (sum(FLOP_COUNTERS[name] * v for name, v in counts.items() if v is not None)
                        if any(v is not None for v in counts.values()) else None)
    stalls = {}
    for name in action.metric_names():
        if (match := _STALL.match(name)) and (v := value(name)):
            stalls[match.group(1)] = v
    total = sum(stalls.values())
    ranked = [{"reason": reason, "share": v / total} for reason, v in sorted(stalls.items(), key=lambda kv: -kv[1])]
    return metrics, ranked[:5]


def nvtx_place(action, layer_names: set[str]) -> tuple[int | None, str | None]:
    """(setting index, conv layer) from the job's NVTX ranges open at the launch."""
    state = action.nvtx_state()
    if state is None:
        return None, None
    setting = layer = None
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        if domain.name() != DOMAIN:
            continue
        for text in domain.push_pop_ranges():
            if (m := re.fullmatch(r"setting (\d+)", text)):
                setting = int(m.group(1))
            elif text in layer_names:
                layer = text
    return setting, layer


def read_report(report_path: Path, layer_names: set[str]) -> list[LaunchProfile]:
    """Every profiled launch in an ncu report that NVTX places in a setting and a conv layer."""
    ncu_report = import_ncu_report()
    context = ncu_report.load_report(str(report_path))
    profiles: list[LaunchProfile] = []
    seen: dict[tuple[int, str, str], int] = {}
    for r in range(context.num_ranges()):
        launches = context.range_by_idx(r)
        for a in range(launches.num_actions()):
            action = launches.action_by_idx(a)
            setting, layer = nvtx_place(action, layer_names)
            if setting is None or layer is None:
                continue
            key = (setting, layer, action.name())
            seen[key] = seen.get(key, -1) + 1
            metrics, stalls = launch_metrics(action)
            profiles.append(LaunchProfile(setting, layer, action.name(), seen[key], metrics, stalls))
    return profiles


def ncu_report_dirs(ncu: str, opt: Path = Path("/opt/nvidia/nsight-compute")) -> list[Path]:
    """The folders holding Nsight Compute's Python reader (extras/python/ncu_report.py) for this `ncu`,
    best first: beside the binary; or, where `ncu` is the CUDA toolkit's launcher script, in the
    toolkit's nsight-compute-<version> folders, then NVIDIA's own install folders (newest first)."""
    binary = Path(os.path.realpath(ncu)).parent
    roots = [binary, *sorted(binary.parent.glob("nsight-compute*"), reverse=True), *sorted(opt.glob("*"), reverse=True)]
    return [root / "extras" / "python" for root in roots if (root / "extras" / "python" / "ncu_report.py").is_file()]


def import_ncu_report():
    """Nsight Compute's Python reader: from the ncu install in use (the same version as the report),
    else the `ncu-report` package."""
    ncu = find_ncu()
    for extras in ncu_report_dirs(ncu)[:1] if ncu else []:
        if str(extras) not in sys.path:
            sys.path.append(str(extras))
    import ncu_report

    return ncu_report


# -- the profile job ----------------------------------------------------------------------------
def profile_command(ncu: str, report_base: Path, kernel_names: list[str], child: list[str]) -> list[str]:
    """ncu over the child process: the conv kernels only (by name), every launch, NVTX recorded. The
    sections give the stalls; --metrics names every metric stored, since no section collects them all
    (on the lent H100, ncu 2025.3.1 with these sections left the DRAM bytes out)."""
    names = "|".join(re.escape(name) for name in sorted(set(kernel_names)))
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    metrics = ",".join(sorted({*METRICS.values(), *FLOP_COUNTERS}))
    return [ncu, "--nvtx", "--target-processes", "all", "--kernel-name", f"regex:^({names})$", *sections,
            "--metrics", metrics, "--force-overwrite", "--export", str(report_base), *child]


def profiled_kernels(variant_names) -> list[str]:
    """The kernels a pass launches, by the variants' registry `launches`: not their `prepare` launches, which
    run once when the weights are bound, outside every conv layer's NVTX range (read_report would drop them)."""
    return list(dict.fromkeys(name for v in dict.fromkeys(variant_names) for name in get_variant(v).pass_kernel_names))


def once_each(spec: JobSpec) -> JobSpec:
    """The job's settings run once each: no warm-up, one pass, timed by events (ncu owns the GPU)."""
    return dataclasses.replace(  # type: ignore[call-arg]  # Cell's fields, made at run time, are unseen by mypy
        spec, repeats=1, warmup=0, profiler="events", stopping=None)


def run_profile_job(spec: JobSpec, out_path: Path, log=None, required: bool = True) -> dict:
    """Profile the conv kernels of every setting of the job once under ncu and write the profile
    file (a ProfileFile, format ncu-1), returning its JSON; status skipped, with the reason, when ncu cannot
    profile, or is not there and not `required` (`ncu: auto`). No GPU, no room for the file, or no ncu where
    it is required raise MachineError, with no file at `out_path`."""
    out_path = Path(out_path)
    with no_result_on_machine_error(out_path):
        return _profile_job(spec, out_path, log or sys.stdout, required)


def _profile_job(spec: JobSpec, out_path: Path, log, required: bool) -> dict:
    from convsweep.model.network import load_network
    from convsweep.base.paths import resolve_network_path

    ncu = find_ncu()
    if ncu is None and required:
        raise MachineError("ncu: true asked for but ncu (Nsight Compute) is not on PATH or $NCU")
    started = time.perf_counter()
    runs = spec.runs()
    profile = ProfileFile(format=PROFILE_FORMAT, profile_id=uuid.uuid4().hex, job_id=spec.job_id, job_key=spec.job_key,
                          job=spec.to_dict(), sweep=spec.sweep, git=git_state(), status="skipped",
                          ncu=_ncu_version(ncu) if ncu else None, started_at=utc_now(), files={},
                          settings=[ProfiledSetting(i, run.run_key, run.params) for i, run in enumerate(runs)],
                          profiles=[])
    if ncu is None:  # ncu: auto on a machine without it: said in the file, and the sweep goes on
        profile.reason = "ncu (Nsight Compute) is not on PATH or $NCU: not profiled (ncu: auto)"
        return _write_profile(out_path, profile, started)
    if spec.settings().guided:  # which settings it measures is known only once it has run
        profile.reason = (f"a {spec.search['strategy']} search's settings are known only once it ran: not "
                          "profiled (profile its winner with a grid job)")
        return _write_profile(out_path, profile, started)
    kernels = profiled_kernels(spec.variants.values())
    report_base = out_path.with_suffix("")
    with writing(report_base.parent):
        report_base.parent.mkdir(parents=True, exist_ok=True)  # ncu writes there, before the profile file
    with tempfile.TemporaryDirectory() as tmp, bind_free_gpu(f"profile {spec.job_id} ({spec.experiment})"):
        spec_file = Path(tmp) / "job.json"
        spec_file.write_text(json.dumps({"job": {**once_each(spec).to_dict(), "sweep": spec.sweep},
                                         "settings": None}))
        child = [sys.executable, "-m", "convsweep.app.cli", "measure", "--spec-file", str(spec_file),
                 "--out", str(Path(tmp) / "measured.jsonl")]
        problem = _run_ncu(profile_command(ncu, report_base, kernels, child), log, float(spec.deadline_s))
        report = report_base.with_suffix(".ncu-rep")
        if problem is None and not report.is_file():
            problem = "ncu wrote no report (did the job launch any conv kernel?)"
        lines = read_progress(Path(tmp) / "measured.jsonl")
    machine = next((line["machine"] for line in lines if "machine" in line), None)
    if machine is not None:  # the child could not open a GPU: ncu's own words would only say it saw no kernel
        raise MachineError(machine)
    measured = [Measurement.from_json(line["measurement"]) for line in lines if "measurement" in line]
    if problem is not None:
        profile.reason = problem
    else:
        network = load_network(resolve_network_path(spec.network))
        try:
            launches = read_report(report, {layer.name for layer in network.conv_layers})
        except ImportError:
            profile.reason = "cannot read the report: no ncu_report module (pip install ncu-report)"
        else:
            profile.status, profile.profiles = "ok", [launch.profiled() for launch in launches]
            profile.files = {"ncu_report": str(report)}
            profile.environment = next((m.environment for m in measured if m.environment), None)
    return _write_profile(out_path, profile, started)


def _write_profile(out_path: Path, profile: ProfileFile, started: float) -> dict:
    """Write the profile file; what it holds, as JSON."""
    profile.seconds = time.perf_counter() - started
    profile.write(out_path)
    return profile.to_json()


def _run_ncu(command: list[str], log, deadline_s: float) -> str | None:
    """Run ncu, its lines into the log, its child's passes held to `deadline_s` times NCU_DEADLINE_FACTOR (a kernel
    that never ends would hold the GPU and the sweep for good: convsweep.measure.deadline); None when it worked,
    else the reason in one line."""
    from .deadline import watch

    errors = []

    def line(text: str) -> None:
        print(text, file=log, flush=True)
        if "==ERROR==" in text:
            errors.append(text.split("==ERROR==", 1)[1].strip())

    limit = deadline_s * NCU_DEADLINE_FACTOR
    status, hung = watch(command, limit, on_line=line)
    if hung is not None:
        return (f"a pass ran past {limit:g} s under Nsight Compute ({NCU_DEADLINE_FACTOR}x the {deadline_s:g} s "
                "deadline): ncu was killed, not profiled")
    if status != 0 or errors:
        return f"ncu exited with {status}" + (f": {errors[0]}" if errors else " (see the job log)")
    return None


def _ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"Version (\S+)", out)
    return match.group(1) if match else None

