"""The result file and its measurements as typed records: the one owner of their keys.

A job writes one `ResultFile` (format 3, workflow/schemas/result.schema.yaml, docs/result-format.md):
the job and one `Measurement` per tunable setting. This module writes it (`to_json`, `write`), reads
it back (`from_json`, formats 1 to 3: the older files hold one measurement, upgraded here to today's
keys), and maps each measurement to the store's columns (`run_columns` and the child rows), so that
nothing else indexes a result by key. It imports no database code: the store sits above it.

A record writes exactly the keys it has. One built by a job has every key a measurement has always
had (`Measurement.new`) plus those set since (`prediction_agreement` once checked, `profiler_note`,
`event_forward_ms` under nsys); one read from a file has the file's keys, so reading and writing a
file gives it back as it was.
"""
from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from convsweep.base.axes import spec_values
from convsweep.sweep.config import variant_label
from convsweep.base.errors import writing
from convsweep.base.fileio import canonical_hash, write_json_atomic
from convsweep.device.findings import describe
from convsweep.base.stats import relative_spread

if TYPE_CHECKING:
    import numpy as np

# The result format written: the newest of workflow/schemas/result.schema.yaml (a store test ties
# the two; reading the schema here would cost every job process its parse).
FORMAT = 3
ONE_MEASUREMENT_FORMATS = (1, 2)  # a file that is its one measurement, at its top level

# What the store keeps of a measurement's parts, as the result file names them.
ENVIRONMENT_KEYS = ("hostname", "gpu", "gpu_uuid", "compute_capability", "driver", "cuda_driver", "nvrtc", "nsys",
                    "python", "packages")
BUILD_KEYS = ("variant", "params", "arch", "options_hash", "source_hash", "compile_ms", "cache_hit", "log", "kernels",
              "findings")
BUILD_IDENTITY = ("variant", "params", "arch", "options_hash", "source_hash")  # hashed into build_key
KERNEL_KEYS = ("layer", "name", "launches", "total_ms", "median_ms", "grid", "block", "registers",
               "static_shared_bytes", "dynamic_shared_bytes", "local_bytes")
MEMCPY_KEYS = ("kind", "count", "bytes", "total_ms")


def utc_now() -> str:
    """A result's time stamp: ISO 8601, UTC, to the millisecond."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def build_key(build: dict[str, Any]) -> str:
    """What names a compiled module across runs: the hash of its variant, tunables, target and source."""
    return canonical_hash({k: build.get(k) for k in BUILD_IDENTITY})


class Part:
    """Base of the records below (dataclasses): a key is written when the record has it. `_absent`
    names those it lacks: read from a file, the keys the file did not hold; new, the OPTIONAL keys
    (those jobs write once they know them). Setting a field gives the record its key."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    PARTS: ClassVar[dict[str, Any]] = {}  # field -> the record class its value (or each item of it) is
    _absent: frozenset[str]
    if TYPE_CHECKING:  # every record is a dataclass: dataclasses.fields takes any of them
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_absent", type(self).OPTIONAL)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        absent = self.__dict__.get("_absent")
        if absent and name in absent:
            object.__setattr__(self, "_absent", absent - {name})

    def to_json(self) -> dict[str, Any]:
        """The record as the file holds it (sharing its dicts with the record)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in self._absent}

    @classmethod
    def from_json(cls, data: dict[str, Any]):
        """The record of a file's object; keys it does not know are left out (the schema allows them)."""
        names = [f.name for f in fields(cls)]
        part = cls(**{name: _read(cls.PARTS.get(name), data[name]) for name in names if name in data})
        object.__setattr__(part, "_absent", frozenset(name for name in names if name not in data))
        return part


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value.to_json() if isinstance(value, (Part, Sample)) else value


def _read(part: Any, value: Any) -> Any:
    if part is None or value is None:
        return value
    if isinstance(value, list):
        return [part.from_json(item) for item in value]
    return part.from_json(value)


@dataclass(slots=True)
class Sample:
    """One timed pass's value of one metric (of one conv layer, or of the whole pass: layer None).
    Always written with its four keys; a file's sample without `layer` reads as layer None."""

    metric: str
    layer: str | None
    repeat: int
    value: float

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "layer": self.layer, "repeat": self.repeat, "value": self.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        return cls(data["metric"], data.get("layer"), data["repeat"], data["value"])


@dataclass
class Timings(Part):
    """Medians over the timed passes (None: not measured), the setting's wall time and compile time."""

    OPTIONAL = frozenset({"event_forward_ms"})

    op_time_ms: dict[str, float | None] | None = None  # conv layer -> its kernels' time per pass
    h2d_ms: float | None = None
    d2h_ms: float | None = None
    compute_ms: float | None = None
    forward_ms: float | None = None
    overlap: float | None = None
    streams_used: float | None = None
    total_s: float | None = None
    compile_ms: float | None = None
    event_forward_ms: float | None = None  # under nsys: the pass as CUDA events timed it


@dataclass
class GridPlace(Part):
    """Where a setting sits in its job (format 3): its index in the job's valid settings, how many the job
    chose and has, the search that chose them, and `proposal`, the order in which a model-guided search
    asked for it (0 first; None where the settings were chosen up front: grid, random)."""

    OPTIONAL = frozenset({"proposal"})

    job_key: str
    index: int
    settings: int
    valid: int
    search: dict[str, Any]
    proposal: int | None = None


@dataclass
class Stopping(Part):
    """How the timed passes ended: the rule (fixed, auto), why, the samples taken, and the passes timed but
    not counted (`discarded`: their NVTX repeat labels; a round that was not visibly new, convsweep.measure.integrity)."""

    OPTIONAL = frozenset({"discarded"})

    rule: str
    reason: str
    samples: int
    noise: float | None = None
    measured_s: float | None = None
    discarded: list[int] | None = None


@dataclass
class Integrity(Part):
    """What the integrity checks (convsweep.measure.integrity) found: which `checks` ran (full, or fast: no
    caching test), how many timed passes were checked and the first that failed, how many ran on
    rounds no kernel had seen (which rounds, made from which seed: `inputs`, so the run can be replayed),
    how new they were, the accuracy on them, the caching test, the device state found before timing,
    work still running after a pass had ended, and the floors the times were held to.
    `reasons`: each thing that makes the measurement `suspect`, one line each."""

    checks: str  # full | fast
    checked_passes: int = 0
    failed_pass: int | None = None  # the first timed pass (repeat number) whose output was wrong
    fresh_passes: int = 0
    inputs: dict[str, Any] | None = None  # {seed (hex), perturbation}: what made the rounds (convsweep.device.rounds)
    rounds: list[int] | None = None  # the round each counted timed pass ran on, in order
    freshness: dict[str, Any] | None = None  # {threshold, share (the least of any round), stale_rounds}
    fresh_accuracy: float | None = None  # the kernel's accuracy over the timed rounds (round 0's is the run's)
    fresh_truth_accuracy: float | None = None  # the float64 truth's over the same rounds
    caching: dict[str, Any] | None = None  # {sightings, rounds, times_ms, ratios, ratio, threshold}; None: not run
    sanitizer: dict[str, Any] | None = None  # {memcheck, initcheck: {errors, first}} or {problem}; None: not asked
    device_state: dict[str, Any] | None = None  # {persisting_l2_bytes, windows, reset, problem}
    idle_wait_ms: float | None = None  # the longest the device still worked after a pass's end
    floor_ms: dict[str, float | None] | None = None  # conv layer (and "forward") -> the physical floor
    peaks: dict[str, Any] | None = None  # the rates the floors were reckoned at (convsweep.device.peaks)
    reasons: list[str] = field(default_factory=list)


@dataclass
class Measurement(Part):
    """One measurement of one setting: identity, provenance, what it was measured under, the check's
    verdict and the times. Fields in the order jobs write them. `logits` (not a field, never written)
    holds the output array where the caller asked to keep it."""

    OPTIONAL = frozenset({"prediction_agreement", "profiler_note", "integrity", "imported_from"})
    PARTS = {"grid": GridPlace, "stopping": Stopping, "timings": Timings, "samples": Sample, "integrity": Integrity}

    measurement_id: str  # uuid4 hex, new each time the setting is measured; the ingest key
    job_id: str
    run_key: str  # sha256 of the canonical JSON of spec
    spec: dict[str, Any]
    sweep: dict[str, Any]
    git: dict[str, Any] | None = None
    sources: dict[str, str] | None = None
    grid: GridPlace | None = None
    clocks: dict[str, Any] | None = None
    clocks_after: dict[str, Any] | None = None
    energy: dict[str, Any] | None = None
    throttle: dict[str, Any] | None = None
    note: str | None = None
    environment: dict[str, Any] | None = None
    stopping: Stopping | None = None
    status: str = "failed"
    error: str | None = None
    profiler: str | None = None
    started_at: str | None = None
    accuracy: float | None = None
    max_rel_err: float | None = None
    tolerance: float | None = None
    images: dict[str, Any] | None = None
    timings: Timings | None = None
    phases_s: dict[str, float | None] | None = None
    floors: dict[str, Any] | None = None
    samples: list[Sample] | None = None
    builds: list[dict[str, Any]] | None = None
    kernels: list[dict[str, Any]] | None = None
    memcpys: list[dict[str, Any]] | None = None
    files: dict[str, str] | None = None
    # Last, where jobs have always written them: set once known.
    prediction_agreement: float | None = None
    profiler_note: str | None = None
    integrity: Integrity | None = None  # GPU measurements since format 3's integrity checks
    imported_from: str | None = None  # what another tool's file it was read from (convsweep.app.kerneltuner); None: measured here

    def __post_init__(self) -> None:
        super().__post_init__()
        self.logits: np.ndarray | None = None

    @classmethod
    def new(cls, job_id: str, run_key: str, spec: dict[str, Any], sweep: dict[str, Any], git: dict[str, Any],
            sources: dict[str, str], grid: GridPlace) -> Measurement:
        """A setting's measurement before measuring: its identity and provenance; failed until measured."""
        return cls(uuid.uuid4().hex, job_id, run_key, spec, sweep, git=git, sources=sources, grid=grid,
                   clocks={"sm_mhz": None, "memory_mhz": None}, started_at=utc_now(), timings=Timings(op_time_ms={}),
                   phases_s={}, floors={}, samples=[], builds=[], kernels=[], memcpys=[], files={})

    @classmethod
    def upgraded(cls, data: dict[str, Any], format: int) -> Measurement:
        """A measurement of a file of `format`: format 1 had no measurement id (its run_key names its one
        measurement) and kept the commit in environment.git_commit."""
        if format == 1:
            env = data.get("environment") or {}
            data = {**data, "measurement_id": data["run_key"],
                    "git": data.get("git") or {"commit": env.get("git_commit"), "dirty": None}}
        return cls.from_json(data)

    @property
    def params(self) -> dict[str, Any] | None:
        """conv layer -> its tunables (the spec's)."""
        return self.spec.get("params")

    def cache_hits(self) -> list[bool | None]:
        """Whether each of the setting's builds came from the compile cache."""
        return [build.get("cache_hit") for build in self.builds or []]

    # -- the store's rows ---------------------------------------------------------------------------
    def spreads(self) -> dict[tuple[str, str | None], float | None]:
        """(metric, layer) -> the relative spread of its samples (convsweep.base.stats.relative_spread)."""
        values: dict[tuple[str, str | None], list[float]] = defaultdict(list)
        for sample in self.samples or []:
            values[(sample.metric, sample.layer)].append(sample.value)
        return {key: relative_spread(group) for key, group in values.items()}

    def run_columns(self) -> dict[str, Any]:
        """The `run` row's columns, but those the store sets (id, sweep_id, environment_id,
        ingested_at, result_path). started_at is the file's ISO 8601 text: ingest parses it, naming
        the file and key where it is not a time."""
        spec, grid, stopping = self.spec, self.grid, self.stopping
        timings = self.timings or Timings()
        images, git, energy = self.images or {}, self.git or {}, self.energy or {}
        clocks, clocks_after, throttle = self.clocks or {}, self.clocks_after or {}, self.throttle
        dataset, repeats, sources = spec.get("dataset"), spec.get("repeats"), self.sources or None
        return {
            "measurement_id": self.measurement_id, "run_key": self.run_key, "job_id": self.job_id,
            "job_key": grid.job_key if grid else None, "grid": grid.to_json() if grid else None,
            "experiment": spec["experiment"], "network": spec["network"],
            "dataset": dataset["name"] if isinstance(dataset, dict) else dataset,  # IDX files: their name
            "variants": spec["variants"], "params": spec.get("params"), "variant": variant_label(spec["variants"]),
            **spec_values(spec),
            # the timed passes taken: the stopping rule's count, else the fixed number asked for
            "repeats": stopping.samples if stopping else (repeats if repeats != "auto" else None),
            "stop_reason": stopping.reason if stopping else None,
            "warmup": spec.get("warmup"), "profiler_requested": spec.get("profiler"), "profiler": self.profiler,
            "status": self.status, "error": self.error, "accuracy": self.accuracy,
            "prediction_agreement": self.prediction_agreement, "max_rel_err": self.max_rel_err,
            "tolerance": self.tolerance, "images_unique": images.get("unique"), "cycled": images.get("cycled"),
            "shipped_bytes": images.get("input_bytes"), "logits_bytes": images.get("logits_bytes"),
            "tail_images": images.get("tail_images"),
            "h2d_ms": timings.h2d_ms, "d2h_ms": timings.d2h_ms, "compute_ms": timings.compute_ms,
            "forward_ms": timings.forward_ms, "forward_spread": self.spreads().get(("forward_ms", None)),
            "forward_min_ms": min((s.value for s in self.samples or [] if s.metric == "forward_ms" and s.layer is None),
                                  default=None),
            "overlap": timings.overlap, "total_s": timings.total_s, "compile_ms": timings.compile_ms,
            "phases": self.phases_s, "floors": self.floors, "files": self.files, "started_at": self.started_at,
            "source_hash": canonical_hash(sources) if sources else None, "sources": sources,
            "git_commit": git.get("commit"), "git_dirty": git.get("dirty"),
            "sm_clock_mhz": clocks.get("sm_mhz"), "memory_clock_mhz": clocks.get("memory_mhz"),
            "sm_clock_after_mhz": clocks_after.get("sm_mhz"), "memory_clock_after_mhz": clocks_after.get("memory_mhz"),
            "throttle_reasons": ",".join(throttle["reasons"]) if throttle else None,
            "throttled_passes": len(set(throttle["repeats"])) if throttle else None,
            "note": "; ".join(n for n in (self.note, self.profiler_note) if n) or None,
            "energy_j": energy.get("joules"), "energy_per_pass_j": energy.get("joules_per_pass"),
            "imported_from": self.imported_from, **self.integrity_columns(),
        }

    def integrity_columns(self) -> dict[str, Any]:
        """The integrity checks' columns of the `run` row (all None for a measurement without them:
        the CPU reference, a failed setting, a file written before the checks)."""
        found = self.integrity
        caching = (found.caching or {}) if found else {}
        floors = (found.floor_ms or {}) if found else {}
        return {"checks": found.checks if found else None,
                "checked_passes": found.checked_passes if found else None,
                "failed_pass": found.failed_pass if found else None,
                "fresh_passes": found.fresh_passes if found else None,
                "caching_ratio": caching.get("ratio"), "peak_floor_ms": floors.get("forward"),
                "input_seed": (found.inputs or {}).get("seed") if found else None,
                "fresh_accuracy": found.fresh_accuracy if found else None,
                "findings": self.findings_line()}

    def findings_line(self) -> str | None:
        """What the kernels of its variants' builds do that a convolution needs not (convsweep.device.findings), one
        line; '' where they were read and show nothing, None where no build says (the CPU, older files)."""
        read = [b for b in self.builds or [] if b.get("variant") != "layers" and b.get("findings") is not None]
        if not read:
            return None
        return "; ".join(line for b in read if (line := describe(b["findings"])))

    def sweep_columns(self) -> dict[str, Any]:
        """The `sweep` row's columns, but created_at."""
        sweep = self.sweep
        return {"experiment": sweep["experiment"], "config_hash": sweep["config_hash"],
                "config_path": sweep.get("config_path")}

    def environment_columns(self) -> dict[str, Any]:
        """The `environment` row's columns, env_hash the hash of all of it (a format 1 commit included)."""
        env = self.environment
        assert env is not None, "the schema requires a measurement's environment"
        return {"env_hash": canonical_hash(env), **{k: env.get(k) for k in ENVIRONMENT_KEYS}}

    def build_rows(self) -> list[dict[str, Any]]:
        """A `build` row's columns per build, build_key first. A build keeps the compile_ms and
        cache_hit of the run that first stored it; each run's own compile time is run.compile_ms."""
        return [{"build_key": build_key(build), **{k: build.get(k) for k in BUILD_KEYS}} for build in self.builds or []]

    def sample_rows(self) -> list[dict[str, Any]]:
        """A `sample` row's columns per sample; throttled: its pass ran with the clocks held down."""
        held = set(self.throttle["repeats"]) if self.throttle else None
        return [{**s.to_json(), "throttled": s.repeat in held if held is not None else None}
                for s in self.samples or []]

    def kernel_rows(self) -> list[dict[str, Any]]:
        return [{k: kernel.get(k) for k in KERNEL_KEYS} for kernel in self.kernels or []]

    def memcpy_rows(self) -> list[dict[str, Any]]:
        return [{k: copy.get(k) for k in MEMCPY_KEYS} for copy in self.memcpys or []]

    def layer_time_rows(self) -> list[dict[str, Any]]:
        """A `layer_time` row's columns per conv layer (conv_layers' order)."""
        variants, params = self.spec["variants"], self.spec.get("params") or {}
        op_time_ms, floors = (self.timings and self.timings.op_time_ms) or {}, self.floors or {}
        spreads = self.spreads()
        floor_ms = (self.integrity.floor_ms or {}) if self.integrity else {}
        return [{"layer_index": index, "layer": layer, "variant": variants.get(layer), "params": params.get(layer),
                 "op_time_ms": op_time_ms.get(layer), "op_time_spread": spreads.get(("op_time_ms", layer)),
                 "flops": (floors.get(layer) or {}).get("flops"), "bytes": (floors.get(layer) or {}).get("bytes"),
                 "peak_floor_ms": floor_ms.get(layer)}
                for index, layer in enumerate(conv_layers(variants, floors, op_time_ms))]

    def phase_rows(self) -> list[dict[str, Any]]:
        return [{"name": name, "seconds": seconds} for name, seconds in (self.phases_s or {}).items()]


def conv_layers(variants: dict[str, Any], floors: dict[str, Any], op_time_ms: dict[str, Any]) -> list[str]:
    """The run's conv layers in layer_index order: those of spec.variants in network order, then
    any other layer that only its op times or floors name."""
    layers = list(variants)
    for layer in [*op_time_ms, *floors]:
        if layer not in layers:
            layers.append(layer)
    return layers


@dataclass
class SettingCounts(Part):
    """A job's settings: the valid ones of its grid, those measured by this attempt, those resumed."""

    valid: int
    measured: int
    resumed: int


class File(Part):
    """Base of the records that are a whole file (ResultFile, and convsweep.measure.files'): `FORMATS`, the values
    of its `format` key that it reads, the one written last; the store's ingest has an entry for each."""

    FORMATS: ClassVar[tuple[int | str, ...]] = ()

    def write(self, path: str | Path) -> None:
        """Atomically: readers never see half a file; a disk that cannot take it is the machine's failure."""
        with writing(path):
            write_json_atomic(path, self.to_json())


@dataclass
class ResultFile(File):
    """One job's result file. Read from a file of format 1 or 2, it holds that file's one measurement
    (upgraded) and the job-level keys are None."""

    FORMATS = (*ONE_MEASUREMENT_FORMATS, FORMAT)
    PARTS = {"settings": SettingCounts, "measurements": Measurement}

    format: int
    job_id: str
    job_key: str | None
    job: dict[str, Any] | None
    sweep: dict[str, Any]
    settings: SettingCounts | None
    started_at: str | None = None
    total_s: float | None = None
    phases_s: dict[str, float | None] | None = None
    files: dict[str, str] | None = None
    measurements: list[Measurement] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResultFile:
        """A result file of any format the schema lists (checked against it already, where it matters)."""
        if data["format"] not in ONE_MEASUREMENT_FORMATS:
            return super().from_json(data)
        measurement = Measurement.upgraded(data, data["format"])
        return cls(data["format"], measurement.job_id, None, None, measurement.sweep, None,
                   measurements=[measurement])

    def to_json(self) -> dict[str, Any]:
        """The file's JSON; a format 1 or 2 file's is its one measurement, as upgraded."""
        if self.format in ONE_MEASUREMENT_FORMATS:
            return {"format": self.format, **self.measurements[0].to_json()}
        return super().to_json()

    def located(self) -> list[tuple[str, Measurement]]:
        """(key path prefix, measurement) of each measurement: `measurements[i].` in a job file, ''
        for an older file's one measurement (its top level)."""
        if self.format in ONE_MEASUREMENT_FORMATS:
            return [("", self.measurements[0])]
        return [(f"measurements[{i}].", m) for i, m in enumerate(self.measurements)]
