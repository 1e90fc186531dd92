"""The files convsweep writes beside the result file, as typed records like it (convsweep.measure.record): the
bench file (`convsweep bench --json`, with its `ceilings`, the device's measured rates), the Nsight Compute
profile file (workflow/schemas/profile.schema.yaml) and the confirm file (workflow/schemas/confirm.schema.yaml).

Each is the one owner of its format and keys: its writer builds it (convsweep.bench.report, convsweep.measure.ncu,
convsweep.measure.confirm), it writes and reads itself (`write`, `from_json`: a file reads back as it was), and it
maps itself to the store's columns. The store checks a file before reading it (the schema; the bench file has
none, so the store checks the keys it reads, each named by where the record found it) and sets what only it
knows: ids, parsed times, the time of ingest. No database code here: the store sits above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from convsweep.device.floors import UNITS

from .record import File, Part

BENCH_FORMAT = "bench-2"  # 2: ceilings a store takes
PROFILE_FORMAT = "ncu-1"
CONFIRM_FORMAT = "confirm-1"


# -- the bench file -----------------------------------------------------------------------------------------
@dataclass
class BenchCeilings(Part):
    """The device's rates as `convsweep bench` measured them: each copy's bytes and samples, the dense matmul
    rate per unit where PyTorch measured it, and the medians and rates the samples give (None: not measured).
    The floors of the GPU's runs are reckoned at these (convsweep.device.floors)."""

    OPTIONAL = frozenset({"matmul_TFLOPps"})

    copy_bytes: int | None = None  # device to device
    copy_samples_ms: list[float] | None = None
    h2d_bytes: int | None = None  # pinned, each way
    h2d_samples_ms: list[float] | None = None
    d2h_samples_ms: list[float] | None = None
    matmul_TFLOPps: dict[str, float | None] | None = None  # unit (fp32, tf32, fp16) -> TFLOP/s
    copy_median_ms: float | None = None
    dtod_GBps: float | None = None  # read + written: the rate every memory floor is divided by
    h2d_median_ms: float | None = None
    h2d_GBps: float | None = None
    d2h_median_ms: float | None = None
    d2h_GBps: float | None = None

    def rate_columns(self) -> dict[str, tuple[str, Any]]:
        """The `device_ceiling` row's rate columns, each as (the key it is read from, its value)."""
        matmul = self.matmul_TFLOPps or {}
        return {"dtod_gbps": ("ceilings.dtod_GBps", self.dtod_GBps), "h2d_gbps": ("ceilings.h2d_GBps", self.h2d_GBps),
                "d2h_gbps": ("ceilings.d2h_GBps", self.d2h_GBps),
                **{f"{unit}_tflops": (f"ceilings.matmul_TFLOPps.{unit}", matmul.get(unit)) for unit in UNITS}}


@dataclass
class BenchFile(File):
    """A `convsweep bench --json` file: the bench run, its `rows` (each conv candidate, forward, end to end and
    harness row with the numbers convsweep.bench.report derives), the best candidate per conv layer, cuDNN's and
    PyTorch's numbers, the targets, and the `ceilings` a store takes. The bench writes every key; a file may lack
    any (it has no schema), and reads back with the keys it had."""

    FORMATS = (BENCH_FORMAT,)
    PARTS = {"ceilings": BenchCeilings}

    format: str = BENCH_FORMAT
    bench_id: str | None = None  # uuid4 hex, new each bench run; the ingest key
    measured_at: str | None = None
    config: str | None = None  # the bench file it ran (bench/default.yaml)
    device: str | None = None
    batch: int | None = None
    instead: list[dict[str, Any]] | None = None
    instead_note: str | None = None
    repeats: int | None = None
    warmup: int | None = None
    seed: int | None = None
    environment: dict[str, Any] | None = None
    ceilings: BenchCeilings | None = None
    best: dict[str, Any] | None = None
    cudnn: dict[str, Any] | None = None
    targets: dict[str, Any] | None = None
    rows: list[dict[str, Any]] | None = None

    def ceiling_columns(self) -> dict[str, tuple[str, Any]]:
        """The `device_ceiling` row's columns, but those the store sets (id, source, ingested_at), each as (the
        key it is read from, its value), so that the store names the key of a value it refuses; measured_at is
        the file's ISO 8601 text."""
        environment = self.environment if isinstance(self.environment, dict) else {}
        rates = self.ceilings.rate_columns() if self.ceilings is not None else {}
        return {"bench_id": ("bench_id", self.bench_id), "gpu": ("device", self.device),
                "gpu_uuid": ("environment.gpu_uuid", environment.get("gpu_uuid")),
                "hostname": ("environment.hostname", environment.get("hostname")),
                "measured_at": ("measured_at", self.measured_at), **rates}


# -- the Nsight Compute profile file ---------------------------------------------------------------------------
@dataclass
class ProfiledSetting(Part):
    """One of the job's settings: its index (what a launch's `setting` names), run_key and tunables."""

    index: int
    run_key: str
    params: dict[str, Any]


@dataclass(kw_only=True)
class ProfiledLaunch(Part):
    """One profiled launch of a conv kernel: where it ran (setting, layer), its order among that setting and
    layer's launches of the kernel, convsweep.measure.ncu.METRICS by our names, the warp stalls, and what limits
    occupancy and bounds the kernel (convsweep.measure.ncu.LaunchProfile)."""

    setting: int
    layer: str
    kernel: str
    launch: int
    metrics: dict[str, float | None]
    stalls: list[dict[str, Any]]  # [{reason, share}], the largest first
    limiter: str | None = None
    bound: str


# The kernel_profile columns that are the launch's metric of the same name; those stored as integers.
PROFILE_METRIC_COLUMNS = ("sm_pct", "memory_pct", "dram_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct",
                          "waves_per_sm", "l1_hit_pct", "l2_hit_pct", "flops", "tensor_pipe_pct")
PROFILE_INTEGER_COLUMNS = ("registers", "block_size", "grid_size", "dram_read_bytes", "dram_write_bytes")


@dataclass(kw_only=True)
class ProfileFile(File):
    """The Nsight Compute profile of one job (format ncu-1): the job, its settings, and every conv kernel launch
    of them profiled; status skipped, with the reason, when nothing was (nothing of it is stored then)."""

    FORMATS = (PROFILE_FORMAT,)
    PARTS = {"settings": ProfiledSetting, "profiles": ProfiledLaunch}

    format: str
    profile_id: str  # uuid4 hex, new each time the job is profiled; the ingest key
    job_id: str
    job_key: str
    job: dict[str, Any] | None = None
    sweep: dict[str, Any]
    git: dict[str, Any] | None = None
    status: str  # ok | skipped
    reason: str | None = None
    ncu: str | None = None  # ncu --version
    environment: dict[str, Any] | None = None  # the profiled process's
    started_at: str | None = None
    seconds: float | None = None
    files: dict[str, str] | None = None
    settings: list[ProfiledSetting]
    profiles: list[ProfiledLaunch]

    def unplaced(self) -> int | None:
        """The index of the first launch whose setting is none of the file's settings; None: every one is."""
        indexes = {s.index for s in self.settings}
        return next((i for i, launch in enumerate(self.profiles) if launch.setting not in indexes), None)

    def kernel_profile_rows(self) -> list[dict[str, Any]]:
        """A `kernel_profile` row's columns per launch, but those the store sets (id, profiled_at: started_at
        parsed, ingested_at); every launch's setting is one of the file's (`unplaced`)."""
        job, settings = self.job or {}, {s.index: s for s in self.settings}
        variants = job.get("variants") or {}
        gpu, commit = (self.environment or {}).get("gpu"), (self.git or {}).get("commit")
        rows = []
        for launch in self.profiles:
            setting, metrics = settings[launch.setting], launch.metrics
            duration_ns = metrics.get("duration_ns")
            static, dynamic = metrics.get("static_shared_bytes"), metrics.get("dynamic_shared_bytes")
            rows.append({
                "profile_id": self.profile_id, "run_key": setting.run_key, "job_id": self.job_id,
                "experiment": self.sweep["experiment"], "variant": variants.get(launch.layer, "?"),
                "params": (setting.params or {}).get(launch.layer) or None, "batch": job.get("batch", 0),
                "setting": launch.setting, "layer": launch.layer, "kernel": launch.kernel, "launch": launch.launch,
                **{k: metrics.get(k) for k in PROFILE_METRIC_COLUMNS},
                "duration_ms": duration_ns / 1e6 if duration_ns is not None else None,
                **{k: _integer(metrics.get(k)) for k in PROFILE_INTEGER_COLUMNS},
                "shared_bytes": int(static + dynamic) if static is not None and dynamic is not None else None,
                "occupancy_limiter": launch.limiter, "stalls": launch.stalls, "bound": launch.bound,
                "metrics": metrics, "gpu": gpu, "git_commit": commit, "ncu": self.ncu})
        return rows


def _integer(value: float | None) -> int | None:
    return int(value) if value is not None else None


# -- the confirm file ---------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class ConfirmCandidate(Part):
    """A setting re-measured: its stored measurement, its variants and tunables, and how its passes went."""

    measurement_id: str  # run.measurement_id
    job_id: str | None = None
    run_key: str | None = None
    variant: str  # its label: the variant, or mixed
    variants: dict[str, str] | None = None  # conv layer -> variant
    params: dict[str, Any] | None = None  # conv layer -> tunables
    status: str  # ok | incorrect | failed
    error: str | None = None


@dataclass(kw_only=True)
class VerdictEntry(Part):
    """One candidate in one layer's verdict: its place in the first ranking and in the confirmed one, its
    standing (winner, tied, slower, incorrect, failed), its samples and the paired test against the winner."""

    measurement_id: str
    first_place: int
    first_ms: float | None = None
    place: int | None = None
    standing: str
    median_ms: float | None = None
    spread: float | None = None
    difference_ms: float | None = None  # the median of the rounds' differences from the winner
    p_value: float | None = None
    detectable_ms: float | None = None
    samples_ms: list[float]
    error: str | None = None


@dataclass
class LayerVerdict(Part):
    """A conv layer's verdict: its candidates in the confirmed order, and whether the first ranking's fastest is
    neither the winner nor tied with it."""

    PARTS = {"entries": VerdictEntry}

    layer: str
    layer_index: int
    overturned: bool
    entries: list[VerdictEntry]


@dataclass(kw_only=True)
class ConfirmFile(File):
    """A confirm job's file (format confirm-1): one cell's fastest settings re-measured, interleaved, and each
    conv layer's verdict. What the rounds ran under (environment, clocks, inputs, freshness) is written once they
    ran; status skipped, with the reason, where there was nothing to tell apart (nothing of it is stored then)."""

    OPTIONAL = frozenset({"environment", "clocks", "clocks_after", "inputs", "freshness"})
    FORMATS = (CONFIRM_FORMAT,)
    PARTS = {"candidates": ConfirmCandidate, "layers": LayerVerdict}

    format: str
    confirmation_id: str  # uuid4 hex, new each time the cell is confirmed; the ingest key
    experiment: str
    group_id: str  # the cell
    batch: int
    top: int
    rounds: int
    started_at: str | None = None
    status: str  # ok | skipped
    reason: str | None = None
    environment: dict[str, Any] | None = None
    clocks: dict[str, Any] | None = None  # {sm_mhz, memory_mhz} before the rounds
    clocks_after: dict[str, Any] | None = None
    inputs: dict[str, Any] | None = None  # what made the rounds: the seed drawn at run time and the perturbation
    freshness: dict[str, Any] | None = None
    candidates: list[ConfirmCandidate]
    layers: list[LayerVerdict]
    total_s: float | None = None

    def stray_entry(self) -> str | None:
        """The key path of the first verdict entry whose measurement is none of the candidates'; None: none is."""
        ids = {c.measurement_id for c in self.candidates}
        return next((f"layers[{i}].entries[{j}]" for i, verdict in enumerate(self.layers)
                     for j, entry in enumerate(verdict.entries) if entry.measurement_id not in ids), None)

    def confirmation_rows(self, run_ids: dict[str, int]) -> list[dict[str, Any]]:
        """A `confirmation` row's columns per layer and entry, but those the store sets (id, confirmed_at:
        started_at parsed, ingested_at); `run_ids`: the stored run of each candidate's measurement (run_id).
        Every entry's measurement is a candidate's (`stray_entry`)."""
        candidates = {c.measurement_id: c for c in self.candidates}
        clocks, after = self.clocks or {}, self.clocks_after or {}
        gpu = (self.environment or {}).get("gpu")
        rows = []
        for verdict in self.layers:
            for entry in verdict.entries:
                candidate = candidates[entry.measurement_id]
                rows.append({
                    "confirmation_id": self.confirmation_id, "group_id": self.group_id, "experiment": self.experiment,
                    "batch": self.batch, "layer": verdict.layer, "layer_index": verdict.layer_index,
                    "run_id": run_ids[entry.measurement_id],
                    "variant": (candidate.variants or {}).get(verdict.layer, candidate.variant),
                    "params": (candidate.params or {}).get(verdict.layer), "first_place": entry.first_place,
                    "first_ms": entry.first_ms, "place": entry.place, "standing": entry.standing,
                    "overturned": verdict.overturned, "median_ms": entry.median_ms, "spread": entry.spread,
                    "difference_ms": entry.difference_ms, "p_value": entry.p_value,
                    "detectable_ms": entry.detectable_ms, "rounds": len(entry.samples_ms),
                    "samples_ms": entry.samples_ms, "error": entry.error, "sm_clock_mhz": clocks.get("sm_mhz"),
                    "sm_clock_after_mhz": after.get("sm_mhz"), "gpu": gpu})
        return rows
