"""The result store's tables as SQLAlchemy 2.x typed models: runs and their builds, samples,
kernels, copies, per-layer times and phases, one environment row per machine setup."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from convsweep.base.axes import AXES, Axis


# Deterministic constraint names, so the hand-written migration and the models agree.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


run_build = Table(
    "run_build",
    Base.metadata,
    Column("run_id", ForeignKey("run.id", ondelete="CASCADE"), primary_key=True),
    Column("build_id", ForeignKey("build.id", ondelete="CASCADE"), primary_key=True, index=True),
)


class DeviceCeiling(Base):
    """One GPU's measured rates, from a `convsweep bench` (its `ceilings`): device copy, pinned copies
    each way, dense matmul per unit. The floors of every run on a GPU of that name are reckoned at its
    latest (convsweep.device.floors); storing a new one reckons them again."""

    __tablename__ = "device_ceiling"

    id: Mapped[int] = mapped_column(primary_key=True)
    bench_id: Mapped[str] = mapped_column(String, unique=True)  # the bench run's: storing its file again adds nothing
    gpu: Mapped[str] = mapped_column(String, index=True)  # as environment.gpu names it
    gpu_uuid: Mapped[str | None] = mapped_column(String)
    hostname: Mapped[str | None] = mapped_column(String)
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    dtod_gbps: Mapped[float] = mapped_column(Float)  # device-to-device copy, read + write
    h2d_gbps: Mapped[float | None] = mapped_column(Float)  # pinned host to device
    d2h_gbps: Mapped[float | None] = mapped_column(Float)
    fp32_tflops: Mapped[float | None] = mapped_column(Float)  # dense matmul (cuBLAS, through PyTorch)
    tf32_tflops: Mapped[float | None] = mapped_column(Float)
    fp16_tflops: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str | None] = mapped_column(String)  # the bench file it came from
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Sweep(Base):
    __tablename__ = "sweep"
    __table_args__ = (UniqueConstraint("experiment", "config_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment: Mapped[str] = mapped_column(String)
    config_hash: Mapped[str] = mapped_column(String)
    config_path: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Environment(Base):
    __tablename__ = "environment"

    id: Mapped[int] = mapped_column(primary_key=True)
    env_hash: Mapped[str] = mapped_column(String, unique=True)
    hostname: Mapped[str | None] = mapped_column(String)
    gpu: Mapped[str | None] = mapped_column(String)
    gpu_uuid: Mapped[str | None] = mapped_column(String)  # NVML's GPU-... name of the device
    compute_capability: Mapped[str | None] = mapped_column(String)
    driver: Mapped[str | None] = mapped_column(String)  # the display driver (NVML), e.g. 580.95.05
    cuda_driver: Mapped[str | None] = mapped_column(String)  # the CUDA version the driver supports
    nvrtc: Mapped[str | None] = mapped_column(String)
    nsys: Mapped[str | None] = mapped_column(String)
    python: Mapped[str | None] = mapped_column(String)
    packages: Mapped[dict[str, Any] | None]


class Build(Base):
    __tablename__ = "build"

    id: Mapped[int] = mapped_column(primary_key=True)
    build_key: Mapped[str] = mapped_column(String, unique=True)
    variant: Mapped[str] = mapped_column(String)
    params: Mapped[dict[str, Any] | None]
    arch: Mapped[str | None] = mapped_column(String)
    options_hash: Mapped[str | None] = mapped_column(String)
    source_hash: Mapped[str | None] = mapped_column(String)
    compile_ms: Mapped[float | None] = mapped_column(Float)
    cache_hit: Mapped[bool | None] = mapped_column(Boolean)
    log: Mapped[str | None] = mapped_column(Text)
    kernels: Mapped[list[Any] | None]
    # kernel -> what its PTX does that a convolution needs not (convsweep.device.findings); NULL: built before findings
    findings: Mapped[dict[str, Any] | None]


_SQL_TYPES = {int: Integer, str: String}


def _axis_column(axis: Axis):
    """An axis's column of `run`: NULL where the axis's default is None (the automatic chunking), else a
    value, which rows stored before the axis existed took from the server default (cache: warm)."""
    return mapped_column(_SQL_TYPES[axis.type], nullable=axis.nullable,
                         server_default=None if axis.required or axis.default is None else str(axis.default))


# The sweep's axes (convsweep.base.axes), a column each; adding one takes a migration that adds its column.
AxisColumns: Any = type("AxisColumns", (), {  # Any to mypy, which cannot see the columns made at run time
    "__doc__": "The run's cell: a column per axis of the sweep (convsweep.base.axes).",
    **{axis.name: _axis_column(axis) for axis in AXES}})


class Run(AxisColumns, Base):
    """One measurement of one tunable setting (run_key: the hash of its spec). A setting measured
    again, say after its kernel changed, gets a new row; the latest_run view keeps the newest."""

    __tablename__ = "run"
    __table_args__ = (Index(None, "experiment", "variant", "batch", "streams"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    measurement_id: Mapped[str] = mapped_column(String, unique=True)
    run_key: Mapped[str] = mapped_column(String, index=True)
    job_id: Mapped[str] = mapped_column(String)
    # Format 3: the job (one cell of the matrix) that measured this setting, and where in its grid;
    # SQL NULL for runs from format 1 and 2 files (one setting per job).
    job_key: Mapped[str | None] = mapped_column(String, index=True)
    grid: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweep.id"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environment.id"), index=True)
    experiment: Mapped[str] = mapped_column(String)
    network: Mapped[str] = mapped_column(String)
    dataset: Mapped[str | None] = mapped_column(String)
    variants: Mapped[dict[str, Any]]
    params: Mapped[dict[str, Any] | None]
    variant: Mapped[str] = mapped_column(String)
    repeats: Mapped[int | None] = mapped_column(Integer)  # timed passes taken (repeats: auto decides how many)
    warmup: Mapped[int | None] = mapped_column(Integer)
    profiler_requested: Mapped[str | None] = mapped_column(String)
    profiler: Mapped[str | None] = mapped_column(String)
    status: Mapped[str] = mapped_column(String)
    error: Mapped[str | None] = mapped_column(Text)
    accuracy: Mapped[float | None] = mapped_column(Float)
    prediction_agreement: Mapped[float | None] = mapped_column(Float)
    max_rel_err: Mapped[float | None] = mapped_column(Float)
    tolerance: Mapped[float | None] = mapped_column(Float)
    images_unique: Mapped[int | None] = mapped_column(Integer)
    cycled: Mapped[bool | None] = mapped_column(Boolean)
    h2d_ms: Mapped[float | None] = mapped_column(Float)
    d2h_ms: Mapped[float | None] = mapped_column(Float)
    compute_ms: Mapped[float | None] = mapped_column(Float)
    forward_ms: Mapped[float | None] = mapped_column(Float)
    # How noisy forward_ms is: its samples' median absolute deviation over their median (null: none).
    forward_spread: Mapped[float | None] = mapped_column(Float)
    forward_min_ms: Mapped[float | None] = mapped_column(Float)  # the fastest timed pass (what a floor bounds)
    stop_reason: Mapped[str | None] = mapped_column(String)  # fixed, converged, timeout or max_samples (the stopping rule)
    overlap: Mapped[float | None] = mapped_column(Float)
    total_s: Mapped[float | None] = mapped_column(Float)
    compile_ms: Mapped[float | None] = mapped_column(Float)
    phases: Mapped[dict[str, Any] | None]
    floors: Mapped[dict[str, Any] | None]
    files: Mapped[dict[str, Any] | None]
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    result_path: Mapped[str | None] = mapped_column(String)
    # Where a run read from another tool's file came from (a Kernel Tuner cache: convsweep.app.kerneltuner); NULL: measured here.
    imported_from: Mapped[str | None] = mapped_column(String)
    # What the measurement was taken from (docs/result-format.md).
    source_hash: Mapped[str | None] = mapped_column(String)  # of all its kernel files together
    sources: Mapped[dict[str, Any] | None]  # kernel file -> its source hash
    git_commit: Mapped[str | None] = mapped_column(String)
    git_dirty: Mapped[bool | None] = mapped_column(Boolean)
    sm_clock_mhz: Mapped[int | None] = mapped_column(Integer)  # at the start of the timed part
    memory_clock_mhz: Mapped[int | None] = mapped_column(Integer)
    sm_clock_after_mhz: Mapped[int | None] = mapped_column(Integer)  # at its end
    memory_clock_after_mhz: Mapped[int | None] = mapped_column(Integer)
    # What the numbers were measured under besides the cell (the L2 state is an axis): NVML's slowdown
    # reasons seen during the timed passes (comma-separated) and after how many passes, and the
    # GPU's energy over the timed part (the whole GPU's, idle gaps between passes included).
    throttle_reasons: Mapped[str | None] = mapped_column(String)
    throttled_passes: Mapped[int | None] = mapped_column(Integer)
    note: Mapped[str | None] = mapped_column(Text)  # throttled passes; nsys asked for but not found
    energy_j: Mapped[float | None] = mapped_column(Float)
    energy_per_pass_j: Mapped[float | None] = mapped_column(Float)
    # What the integrity checks found (convsweep.measure.integrity; NULL where none ran: the CPU reference, runs
    # stored before them). checks: full, or fast (the experiment turned the fresh inputs and the caching
    # test off), which every table that shows the run says. A run they made `suspect` has its reasons in error.
    checks: Mapped[str | None] = mapped_column(String)
    checked_passes: Mapped[int | None] = mapped_column(Integer)  # timed passes whose output was checked
    failed_pass: Mapped[int | None] = mapped_column(Integer)  # the first of them whose output was wrong
    fresh_passes: Mapped[int | None] = mapped_column(Integer)  # timed passes over inputs not seen before in the run
    caching_ratio: Mapped[float | None] = mapped_column(Float)  # the caching test: a later sighting's median / the first's
    input_seed: Mapped[str | None] = mapped_column(String)  # what the rounds were made from (hex): they can be made again
    fresh_accuracy: Mapped[float | None] = mapped_column(Float)  # on the timed rounds (accuracy: round 0's, the seeds')
    # What the run's kernels do that a convolution needs not, one line from their builds' findings ('': nothing)
    findings: Mapped[str | None] = mapped_column(Text)
    peak_floor_ms: Mapped[float | None] = mapped_column(Float)  # the whole pass at the GPU's peak rates: below it, suspect
    # What a pass moves over the bus (the input in its format, the logits) and its smallest chunk: with the
    # conv layers' work (floors) what the floors at measured rates are reckoned from (convsweep.device.floors).
    shipped_bytes: Mapped[int | None] = mapped_column(BigInteger)
    logits_bytes: Mapped[int | None] = mapped_column(BigInteger)
    tail_images: Mapped[int | None] = mapped_column(Integer)
    # The floors at this GPU's measured rates (the latest device_ceiling of its GPU; NULL without one):
    # the compute of a pass (compute_ms's) and the host-to-host pass (forward_ms's).
    ceiling_id: Mapped[int | None] = mapped_column(Integer, index=True)  # device_ceiling.id (a column SQLite can add)
    compute_floor_ms: Mapped[float | None] = mapped_column(Float)
    forward_floor_ms: Mapped[float | None] = mapped_column(Float)

    sweep: Mapped[Sweep] = relationship()
    environment: Mapped[Environment] = relationship()
    builds: Mapped[list[Build]] = relationship(secondary=run_build)
    samples: Mapped[list[Sample]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    kernels: Mapped[list[KernelStat]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    memcpys: Mapped[list[Memcpy]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    layer_times: Mapped[list[LayerTime]] = relationship(cascade="all, delete-orphan", passive_deletes=True,
                                                        order_by="LayerTime.layer_index")
    phase_times: Mapped[list[Phase]] = relationship(cascade="all, delete-orphan", passive_deletes=True)


class Sample(Base):
    __tablename__ = "sample"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    metric: Mapped[str] = mapped_column(String)
    layer: Mapped[str | None] = mapped_column(String)
    repeat: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    throttled: Mapped[bool | None] = mapped_column(Boolean)  # its pass ran with the clocks held down (NVML)


class KernelStat(Base):
    __tablename__ = "kernel"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    layer: Mapped[str | None] = mapped_column(String)
    name: Mapped[str] = mapped_column(String)
    launches: Mapped[int | None] = mapped_column(Integer)
    total_ms: Mapped[float | None] = mapped_column(Float)
    median_ms: Mapped[float | None] = mapped_column(Float)
    grid: Mapped[list[Any] | None]
    block: Mapped[list[Any] | None]
    registers: Mapped[int | None] = mapped_column(Integer)
    static_shared_bytes: Mapped[int | None] = mapped_column(Integer)
    dynamic_shared_bytes: Mapped[int | None] = mapped_column(Integer)
    local_bytes: Mapped[int | None] = mapped_column(Integer)


class Memcpy(Base):
    __tablename__ = "memcpy"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String)
    count: Mapped[int | None] = mapped_column(Integer)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    total_ms: Mapped[float | None] = mapped_column(Float)


class LayerTime(Base):
    """One conv layer of one run: its median op time and its floors (docs/result-format.md), so
    GFLOP/s and floor-based GB/s are plain arithmetic in SQL. Failed runs have no op time. The
    only place op times are stored: the seeds' op time 1 and 2 are layer_index 0 and 1."""

    __tablename__ = "layer_time"
    __table_args__ = (UniqueConstraint("run_id", "layer_index"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    layer: Mapped[str] = mapped_column(String, primary_key=True)
    layer_index: Mapped[int] = mapped_column(Integer)  # 0-based position among the run's conv layers
    variant: Mapped[str | None] = mapped_column(String)  # this layer's variant (runs may mix them)
    # This layer's tunables (the run's spec.params[layer]); None is SQL NULL, not JSON's 'null'.
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    op_time_ms: Mapped[float | None] = mapped_column(Float)
    # How noisy op_time_ms is: its samples' median absolute deviation over their median (null: none).
    op_time_spread: Mapped[float | None] = mapped_column(Float)
    flops: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    # The physical floor the integrity checks held op_time_ms to, at the GPU's peak rates (NULL where none ran).
    peak_floor_ms: Mapped[float | None] = mapped_column(Float)
    # Its floor at the GPU's measured rates (run.ceiling_id's; NULL without one): what "× floor" divides by.
    floor_ms: Mapped[float | None] = mapped_column(Float)


class Phase(Base):
    """Where one run's wall time went (total_s split: process start, load, compile, allocate,
    warm-up, timed repeats, check, nsys profile/export), from the result's phases_s."""

    __tablename__ = "phase"

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    seconds: Mapped[float | None] = mapped_column(Float)


class KernelProfile(Base):
    """One conv kernel launch of one setting, profiled once by Nsight Compute in a job of its own
    (results/<experiment>/ncu/, workflow/schemas/profile.schema.yaml): the evidence for why the
    kernel takes the time its timed runs measured (run_key names the setting in both)."""

    __tablename__ = "kernel_profile"
    __table_args__ = (UniqueConstraint("profile_id", "setting", "layer", "kernel", "launch"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    profile_id: Mapped[str] = mapped_column(String, index=True)  # one profile job's run: the ingest key
    run_key: Mapped[str] = mapped_column(String, index=True)
    job_id: Mapped[str] = mapped_column(String)
    experiment: Mapped[str] = mapped_column(String)
    variant: Mapped[str] = mapped_column(String)  # the layer's
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))  # the layer's tunables
    batch: Mapped[int] = mapped_column(Integer)
    setting: Mapped[int] = mapped_column(Integer)  # index among the job's settings
    layer: Mapped[str] = mapped_column(String)
    kernel: Mapped[str] = mapped_column(String)
    launch: Mapped[int] = mapped_column(Integer)  # its order among the layer's launches of this kernel
    duration_ms: Mapped[float | None] = mapped_column(Float)
    sm_pct: Mapped[float | None] = mapped_column(Float)  # throughputs, % of peak sustained
    memory_pct: Mapped[float | None] = mapped_column(Float)
    dram_pct: Mapped[float | None] = mapped_column(Float)
    achieved_occupancy_pct: Mapped[float | None] = mapped_column(Float)
    theoretical_occupancy_pct: Mapped[float | None] = mapped_column(Float)
    occupancy_limiter: Mapped[str | None] = mapped_column(String)  # registers, shared memory, warps per block ...
    registers: Mapped[int | None] = mapped_column(Integer)  # per thread
    shared_bytes: Mapped[int | None] = mapped_column(Integer)  # per block, static and dynamic
    block_size: Mapped[int | None] = mapped_column(Integer)
    grid_size: Mapped[int | None] = mapped_column(BigInteger)
    waves_per_sm: Mapped[float | None] = mapped_column(Float)
    l1_hit_pct: Mapped[float | None] = mapped_column(Float)
    l2_hit_pct: Mapped[float | None] = mapped_column(Float)
    dram_read_bytes: Mapped[int | None] = mapped_column(BigInteger)
    dram_write_bytes: Mapped[int | None] = mapped_column(BigInteger)
    flops: Mapped[float | None] = mapped_column(Float)  # on the CUDA cores (an FMA is two); tensor cores apart
    tensor_pipe_pct: Mapped[float | None] = mapped_column(Float)
    stalls: Mapped[list[Any] | None]  # [{reason, share}], the largest first
    bound: Mapped[str] = mapped_column(String)  # one line: what bounds the kernel
    metrics: Mapped[dict[str, Any]]  # every metric read, by convsweep.measure.ncu's names
    gpu: Mapped[str | None] = mapped_column(String)
    git_commit: Mapped[str | None] = mapped_column(String)
    ncu: Mapped[str | None] = mapped_column(String)
    profiled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Confirmation(Base):
    """One setting's verdict in one layer's confirmation (convsweep/measure/confirm.py, workflow/schemas/confirm.schema.yaml):
    the fastest settings of a cell's conv layer measured again in one process, interleaved, and which of them
    wins, which cannot be told from it (tied) and which is slower. `run_id` is the stored run re-measured."""

    __tablename__ = "confirmation"
    __table_args__ = (UniqueConstraint("confirmation_id", "layer", "run_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    confirmation_id: Mapped[str] = mapped_column(String, index=True)  # one confirm job's run: the ingest key
    group_id: Mapped[str] = mapped_column(String)  # the cell
    experiment: Mapped[str] = mapped_column(String)
    batch: Mapped[int] = mapped_column(Integer)
    layer: Mapped[str] = mapped_column(String)
    layer_index: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    variant: Mapped[str] = mapped_column(String)  # the layer's
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))  # the layer's tunables
    first_place: Mapped[int] = mapped_column(Integer)  # in the ranking of the cell's own runs (1: fastest)
    first_ms: Mapped[float | None] = mapped_column(Float)  # its op time there
    place: Mapped[int | None] = mapped_column(Integer)  # in the confirmation (None: its pass was wrong or failed)
    standing: Mapped[str] = mapped_column(String)  # winner, tied, slower, incorrect, failed
    overturned: Mapped[bool] = mapped_column(Boolean)  # the layer's: the first fastest is neither winner nor tied
    median_ms: Mapped[float | None] = mapped_column(Float)  # over the confirmation's rounds
    spread: Mapped[float | None] = mapped_column(Float)
    difference_ms: Mapped[float | None] = mapped_column(Float)  # median of the rounds' differences from the winner
    p_value: Mapped[float | None] = mapped_column(Float)  # paired Wilcoxon test against the winner
    detectable_ms: Mapped[float | None] = mapped_column(Float)  # the smallest difference these rounds would find
    rounds: Mapped[int] = mapped_column(Integer)
    samples_ms: Mapped[list[Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    sm_clock_mhz: Mapped[int | None] = mapped_column(Integer)  # before the rounds
    sm_clock_after_mhz: Mapped[int | None] = mapped_column(Integer)
    gpu: Mapped[str | None] = mapped_column(String)
    confirmed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
