"""Kernel Tuner interop: an experiment's stored runs as Kernel Tuner's T4 results (`convsweep export --format kt-t4`),
and a Kernel Tuner cache file stored as runs marked as imported (`convsweep import`).

A convsweep run is one setting of a whole network, so a T4 configuration names it with flat keys: `conv1.variant`,
`conv1.BLOCK` (each conv layer's variant and tunables), `network` and each axis (`batch`, `streams` ...); its
objective `time` is the metric asked for (the conv layers' op times added up, by default). A Kernel Tuner cache
holds one kernel at one problem size, each entry one configuration: it becomes a run of that one conv layer
(variants and params name that layer alone), the entry's time the layer's op time and its times the samples; an
entry Kernel Tuner could not measure is a failed run saying why. Which variant, conv layer and batch the kernel
was is given, or read from the cache: kernel_name as a variant's name (or the kernel of one variant alone), and
problem_size as the kernel's output tensor, one thread per element (its product a whole number of the layer's
per-image outputs). The entries are Measurements of one result file stored through the one ingest path; each
one's measurement id hashes the cache's header and the entry, so importing a file again stores nothing twice.
A cache is read within bounds (MAX_CACHE_BYTES, nesting, finite numbers, UTF-8 text) before the store is opened,
and each file that cannot be imported is one line while the others go on. Kernel Tuner itself is needed only to
export: the T4 schema the file is checked against is its package's.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from convsweep.base.axes import AXES, NAMES, columns, job_id_part, order_by
from convsweep.base.errors import ConfigError, ConvsweepError, StoreError, writing
from convsweep.base.fileio import canonical_hash, json_column

if TYPE_CHECKING:
    from convsweep.measure.record import Measurement, ResultFile

EXPORT_FORMATS = ("kt-t4",)
OBJECTIVE = "time"  # the T4 objective: Kernel Tuner's default name, whatever metric it holds
METRICS = ("op_time", "forward_ms")  # or a conv layer's name: compare's vocabulary
DEFAULT_EXPERIMENT = "kernel-tuner"
DEFAULT_NETWORK = "networks/lenet86.yaml"
IMPORTED_BY = "kernel_tuner"  # run.profiler and the head of run.imported_from: what timed an imported run

# Kernel Tuner's names for a configuration it could not measure (kernel_tuner.util's ErrorConfig classes, as its
# cache files spell them), the T4 invalidity of each, and what it means.
KT_ERRORS = {
    "InvalidConfig": ("constraints", "breaks a restriction or a device limit"),
    "CompilationFailedConfig": ("compile", "did not compile"),
    "RuntimeFailedConfig": ("runtime", "failed to launch or run"),
    "ErrorConfig": ("runtime", "could not be measured"),
}
CACHE_KEYS = ("device_name", "kernel_name", "tune_params_keys", "cache")  # what every cache's header has
# A cache entry is ~210 bytes, so this is ~300,000 configurations (the largest cache met was 59 MB); the bound of a
# result file (store.strict_json.MAX_RESULT_BYTES), since the cache becomes one. Past it, parsing takes gigabytes.
MAX_CACHE_BYTES = 64 * 2**20
# A JSON escape of a UTF-16 surrogate: the one way a string of strict UTF-8 text can hold a lone one, which no
# database can store (UTF-8 has no encoding for it).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


# -- export -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Exported:
    """What an export wrote: the file, its results by T4 invalidity, and the schema version it was checked against."""

    path: Path
    invalidity: Counter
    schema_version: str

    @property
    def results(self) -> int:
        return sum(self.invalidity.values())


def t4_results_schema() -> tuple[str, dict]:
    """(version, schema) of the newest T4 results schema the installed kernel_tuner ships (found, not imported:
    its package imports numpy and its backends); ConfigError where kernel_tuner is not installed."""
    spec = importlib.util.find_spec("kernel_tuner")
    roots = list(spec.submodule_search_locations or []) if spec else []
    found = [d for root in roots for d in (Path(root) / "schema" / "T4").glob("*")
             if re.fullmatch(r"\d+\.\d+\.\d+", d.name) and (d / "results-schema.json").is_file()]
    if not found:
        raise ConfigError("export --format kt-t4: the file is checked against Kernel Tuner's T4 results schema, "
                          "which comes with its package: pip install kernel_tuner")
    newest = max(found, key=lambda d: tuple(int(part) for part in d.name.split(".")))
    return newest.name, json.loads((newest / "results-schema.json").read_text(encoding="utf-8"))


def check_t4(document: dict, schema: dict, version: str) -> None:
    """ConvsweepError naming the key where `document` breaks the T4 results schema (a bug here, not the data's)."""
    from jsonschema import validators
    from jsonschema.exceptions import best_match

    error = best_match(validators.validator_for(schema)(schema).iter_errors(document))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        raise ConvsweepError(f"export: the T4 results break Kernel Tuner's schema {version} at {where or 'the top'}: "
                             f"{error.message}")


_RUNS_SQL = f"""
    SELECT r.id, r.network, r.variants, r.params, {columns("r")}, r.status, r.error, r.started_at, r.forward_ms,
           r.compute_ms, r.compile_ms, r.phases, r.energy_per_pass_j, r.max_rel_err, r.imported_from
    FROM latest_run r
    WHERE r.experiment = :experiment
    ORDER BY r.variant, {order_by("r")}, r.id"""

_LAYERS_SQL = """
    SELECT lt.run_id, lt.layer, lt.op_time_ms
    FROM layer_time lt JOIN latest_run r ON r.id = lt.run_id
    WHERE r.experiment = :experiment
    ORDER BY lt.run_id, lt.layer_index"""


def export_t4(url: str | None, experiment: str, out_path: str | Path, metric: str = "op_time") -> Exported:
    """Write the newest measurement of every setting of `experiment` as T4 results, checked against Kernel Tuner's
    schema before the file is written (atomically). `metric`: op_time, forward_ms or a conv layer's op time."""
    from convsweep.analysis.compare import stored_samples
    from convsweep.base.fileio import write_json_atomic
    from convsweep.analysis.query import fetch_dicts

    version, schema = t4_results_schema()
    _, runs = fetch_dicts(url, _RUNS_SQL, {"experiment": experiment})
    if not runs:
        raise ConvsweepError(f"export: experiment {experiment!r} has no stored run")
    _, layer_rows = fetch_dicts(url, _LAYERS_SQL, {"experiment": experiment})
    op_times: dict[int, dict[str, float | None]] = {}
    for row in layer_rows:
        op_times.setdefault(row["run_id"], {})[row["layer"]] = row["op_time_ms"]
    layers = sorted({layer for times in op_times.values() for layer in times})
    if metric not in METRICS and metric not in layers:
        raise ConfigError(f"export: --metric {metric!r}: expected {', '.join(METRICS)} or a conv layer of "
                          f"{experiment}'s runs ({', '.join(layers) or 'none stored'})")
    samples = stored_samples(url, [run["id"] for run in runs]).get(metric, {})
    results = [t4_result(run, op_times.get(run["id"], {}), samples.get(run["id"], []), metric) for run in runs]
    document = {"schema_version": version, "results": results,
                "metadata": {"timeunit": "milliseconds", "experiment": experiment, OBJECTIVE: metric}}
    check_t4(document, schema, version)
    with writing(out_path):
        write_json_atomic(out_path, document)
    return Exported(Path(out_path), Counter(result["invalidity"] for result in results), version)


def t4_result(run: dict[str, Any], op_time_ms: dict[str, float | None], runtimes: list[float], metric: str) -> dict:
    """One stored run as a T4 result: its setting as flat keys, its times, what Kernel Tuner would call its validity,
    and its measurements (values it lacks left out: the schema has no null)."""
    variants, params = json_column(run["variants"]), json_column(run["params"]) or {}
    configuration: dict[str, Any] = {"network": run["network"]}
    for layer, variant in variants.items():
        for name, value in {"variant": variant, **(params.get(layer) or {})}.items():
            if f"{layer}.{name}" in configuration:
                raise ConvsweepError(f"export: run {run['id']}: {layer}'s tunable {name!r} has the name of its variant's key")
            configuration[f"{layer}.{name}"] = value
    configuration.update({name: run[name] for name in NAMES if run[name] is not None})
    layer_times = [op_time_ms.get(layer) for layer in variants]
    time_ms = {"op_time": sum(cast(list[float], layer_times)) if layer_times and None not in layer_times else None,
               "forward_ms": run["forward_ms"]}.get(metric, op_time_ms.get(metric))
    phases = json_column(run["phases"]) or {}
    times = {"compilation_time": run["compile_ms"], "benchmark": _ms(phases.get("timed")),
             "validation": _ms(phases.get("check")), "runtimes": list(runtimes)}
    measured = [(OBJECTIVE, time_ms, "ms"), *((f"{layer}.op_time_ms", ms, "ms") for layer, ms in op_time_ms.items()),
                ("forward_ms", run["forward_ms"], "ms"), ("compute_ms", run["compute_ms"], "ms"),
                ("energy_per_pass_j", run["energy_per_pass_j"], "J"), ("max_rel_err", run["max_rel_err"], ""),
                ("status", run["status"], ""), ("error", run["error"], ""), ("imported_from", run["imported_from"], "")]
    result = {"configuration": configuration, "times": {k: v for k, v in times.items() if v is not None},
              "invalidity": invalidity(run["status"], run["error"]),
              "correctness": 1 if run["status"] in ("ok", "suspect") else 0,
              "measurements": [{"name": name, "value": value, "unit": unit} for name, value, unit in measured
                               if value is not None],
              "objectives": [OBJECTIVE]}
    if run["started_at"] is not None:
        result = {"timestamp": _iso(run["started_at"]), **result}
    return result


def invalidity(status: str, error: str | None) -> str:
    """A run's T4 invalidity: correct (ok or suspect: its outputs passed), correctness (incorrect), and for a failed
    run Kernel Tuner's kind where an imported run names it, compile where NVRTC refused the kernel, else runtime."""
    if status in ("ok", "suspect"):
        return "correct"
    if status == "incorrect":
        return "correctness"
    named = next((kind for name, (kind, _) in KT_ERRORS.items() if f"Kernel Tuner: {name}:" in (error or "")), None)
    return named or ("compile" if "NVRTC" in (error or "") else "runtime")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def _iso(value: Any) -> str:
    """A stored time as ISO 8601 in UTC: PostgreSQL hands back a datetime, SQLite its text without a zone."""
    stamp = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).isoformat()


# -- import -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    """What a cache's kernel was in convsweep's terms: a variant at one conv layer of a network, for `batch` images."""

    network: str  # as given: the spec's network
    variant: str
    layer: str
    batch: int
    floors: dict[str, Any] = field(default_factory=dict)  # the layer's flops and bytes at that batch (record.floors)


@dataclass(frozen=True)
class Imported:
    """What an import stored: the kernel it read the cache as, and the ingest's counts."""

    kernel: Kernel
    added: int
    unchanged: int
    by_status: dict[str, int]


def read_cache(path: Path) -> dict[str, Any]:
    """A Kernel Tuner cache file's JSON, as kernel_tuner.util.read_cache takes it: one a tuning run left open (no
    closing brackets, a trailing comma) is closed first. Read within bounds (MAX_CACHE_BYTES, strict_json's depth
    and numbers, no lone surrogate): ConfigError, one line naming the file, when it is not a cache."""
    text = _bounded_text(path)
    try:
        data = json.loads(text)
    except ValueError as first:  # JSONDecodeError, or an integer past Python's 4,300 digits
        try:  # Kernel Tuner's own repair of a file it was still appending to
            data = json.loads((text[:-1] if text.endswith(",") else text) + "}\n}")
        except ValueError:
            raise ConfigError(f"{path}: not a Kernel Tuner cache file: not JSON ({first})") from None
    _check_values(path, text, data)
    missing = [key for key in CACHE_KEYS if not isinstance(data, dict) or key not in data]
    if missing:
        raise ConfigError(f"{path}: not a Kernel Tuner cache file: expected an object with {', '.join(CACHE_KEYS)}; "
                          f"it lacks {', '.join(missing)}")
    names = {key: data[key] for key in ("device_name", "kernel_name") if not isinstance(data[key], str)}
    if names:
        key, value = next(iter(names.items()))
        raise ConfigError(f"{path}: {key}: expected a string, got {value!r}")
    keys, entries = data["tune_params_keys"], data["cache"]
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise ConfigError(f"{path}: tune_params_keys: expected a list of tunable names, got {keys!r}")
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise ConfigError(f"{path}: cache: expected an object of configurations, each an object")
    if not entries:
        raise ConfigError(f"{path}: cache: no configuration in it")
    return data


def _bounded_text(path: Path) -> str:
    """The file's UTF-8 text, stripped, read only when at most MAX_CACHE_BYTES and nested at most strict_json's
    MAX_DEPTH (Python's json recurses per level: a deep file is a RecursionError, not a line)."""
    from convsweep.base.strict_json import MAX_DEPTH, nesting_depth

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_CACHE_BYTES:  # refused unread
                raise ConfigError(f"{path}: {size:,} bytes; a Kernel Tuner cache file holds at most "
                                  f"{MAX_CACHE_BYTES:,}")
            data = f.read(MAX_CACHE_BYTES + 1)  # never more, whatever the file (a pipe, one still growing)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_CACHE_BYTES:
        raise ConfigError(f"{path}: more than {MAX_CACHE_BYTES:,} bytes; a Kernel Tuner cache file holds at most "
                          f"{MAX_CACHE_BYTES:,}")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a Kernel Tuner cache file: not UTF-8 text ({e.reason} at byte {e.start})"
                          ) from None
    if nesting_depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(f"{path}: not a Kernel Tuner cache file: nested more than {MAX_DEPTH} levels deep")
    return text


def _check_values(path: Path, text: str, document: Any) -> None:
    """ConfigError naming the file and the key of the first value no column can hold: a number strict_json
    refuses (NaN, Infinity, 1e309, past 64 bits), or a string with a lone surrogate."""
    from convsweep.base.schema import key_path
    from convsweep.base.strict_json import check_values

    try:
        check_values(document, str(path))
    except StoreError as e:
        raise ConfigError(str(e)) from None
    if not _SURROGATE_ESCAPE.search(text):  # the walk below only for a file that has such an escape
        return
    stack: list[tuple[tuple, Any]] = [((), document)]
    while stack:
        where, value = stack.pop()
        strings = [(where, value)] if isinstance(value, str) else \
            [(where, key) for key in value] if isinstance(value, dict) else []
        for at, string in strings:
            if _LONE_SURROGATE.search(string):
                raise ConfigError(f"{path}: {key_path(at)}: expected text, got a lone UTF-16 surrogate in "
                                  f"{json.dumps(string)[:60]} (a string no database stores)")
        if isinstance(value, dict):
            stack.extend(((*where, key), item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend(((*where, i), value[i]) for i in range(len(value) - 1, -1, -1))


def kt_error(entry: dict[str, Any]) -> str | None:
    """The name of the error Kernel Tuner recorded for a configuration (`__error__`, or `time` in older files:
    any value that is one of its error names, as read_cache finds it), or None for a measured one."""
    return next((value for value in entry.values() if isinstance(value, str) and value in KT_ERRORS), None)


def resolve_kernel(path: Path, cache: dict[str, Any], network_path: str, variant: str | None = None,
                   layer: str | None = None, batch: int | None = None) -> Kernel:
    """Which variant, conv layer and batch the cache measured: those given, the rest read from its kernel_name and
    problem_size (module docstring); ConfigError saying what to give where the cache cannot tell."""
    from convsweep.model.network import load_network
    from convsweep.base.paths import resolve_network_path
    from convsweep.model.variants import get_variant, load_registry

    kernel_name = cache["kernel_name"]
    if variant is None:
        registry = load_registry()
        launching = [name for name, v in registry.items() if kernel_name in v.kernel_names]
        if kernel_name in registry or len(launching) == 1:
            variant = kernel_name if kernel_name in registry else launching[0]
        else:
            who = f"is launched by {len(launching)} variants ({', '.join(launching)})" if launching else \
                "names no variant of kernels/variants.yaml nor a kernel of one alone"
            raise ConfigError(f"{path}: kernel_name {kernel_name!r} {who}: give --variant")
    var = get_variant(variant)
    unknown = [name for name in cache["tune_params_keys"] if name not in var.params]
    if unknown:
        raise ConfigError(f"{path}: tune_params_keys: {unknown[0]!r} is no tunable of variant {variant} "
                          f"(it has {', '.join(var.params) or 'none'})")
    network = load_network(resolve_network_path(network_path, Path.cwd()))
    layers = [network.layer(layer)] if layer else network.conv_layers
    if layer and not layers[0].is_conv:
        raise ConfigError(f"--layer {layer}: expected a conv layer of {network_path} "
                          f"({', '.join(conv.name for conv in network.conv_layers)})")
    per_image = {}
    for conv in layers:
        try:
            per_image[conv.name] = math.prod(network.variant_shape(conv, var.fuses).out_shape)
        except ConvsweepError:  # a fusion the layers after it do not match: not this layer
            continue
    if layer and batch:
        found = [(layer, batch)]
    else:
        outputs = _problem_elements(cache.get("problem_size"))
        found = [(name, batch or outputs // each) for name, each in per_image.items()
                 if outputs and outputs % each == 0 and (batch is None or outputs == batch * each)]
    if len(found) != 1:
        size = json.dumps(cache.get("problem_size"))
        each_image = ", ".join(f"{name} {each}" for name, each in per_image.items()) or "none it fits"
        what = " and ".join(f"--{k}" for k, given in (("layer", layer), ("batch", batch)) if not given)
        raise ConfigError(f"{path}: problem_size {size} is not the output of one of {variant}'s conv layers at a "
                          f"whole batch (it fits {len(found)}; outputs per image: {each_image}): give {what}")
    (name, images), = found
    if name not in per_image:
        raise ConfigError(f"{path}: variant {variant} does not fit layer {name} of {network_path}")
    shape = network.variant_shape(network.layer(name), var.fuses, images)
    floors = {name: {"bytes": shape.min_bytes, "flops": shape.flops, "unit": var.unit}}
    return Kernel(network_path, variant, name, images, floors)


def _problem_elements(problem_size: Any) -> int | None:
    """The threads a problem_size asks for (an integer or a list of them), or None for any other value."""
    sizes = problem_size if isinstance(problem_size, list) else [problem_size]
    if sizes and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        return math.prod(sizes)
    return None


def _number(value: Any, path: Path, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{path}: {key}: expected a finite number of milliseconds, 0 or more, got {value!r}")
    return float(value)


def _timestamp(value: Any, path: Path, key: str) -> str | None:
    if value is None:
        return None
    try:
        stamp = datetime.fromisoformat(str(value))
    except ValueError:
        raise ConfigError(f"{path}: {key}: expected a time as Kernel Tuner writes it, got {value!r}") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).isoformat()


def cache_result(path: Path, cache: dict[str, Any], kernel: Kernel, experiment: str) -> ResultFile:
    """The cache as one result file (convsweep.measure.record.ResultFile, format 3): one Measurement per configuration,
    in the cache's order, marked as imported from it."""
    from convsweep.measure.record import FORMAT, GridPlace, Measurement, ResultFile, SettingCounts

    keys, entries = cache["tune_params_keys"], cache["cache"]
    header = {k: cache.get(k) for k in ("device_name", "kernel_name", "problem_size", "tune_params_keys")}
    # Every required axis but batch has a default.
    cell = {axis.name: kernel.batch if axis.name == "batch" else cast(list, axis.config_default)[0]
            for axis in AXES if axis.required}
    grid, settings = tunable_grid(path, keys, entries)
    job: dict[str, Any] = {"experiment": experiment, "network": kernel.network,
                           "variants": {kernel.layer: kernel.variant}, "grid": {kernel.variant: grid},
                           "search": {"strategy": "grid"}, **cell}
    job_key = canonical_hash(job)
    job_id = f"kt-{kernel.variant}-{kernel.layer}{job_id_part(cell)}-{job_key[:10]}"
    sweep = {"experiment": experiment, "config_hash": job_key, "config_path": str(path)}
    environment = {"gpu": cache["device_name"] or None}  # all a cache records of its machine ("" on the CPU)
    measurements = []
    for index, ((entry_key, entry), params) in enumerate(zip(entries.items(), settings)):
        spec = {"experiment": experiment, "network": kernel.network, "variants": {kernel.layer: kernel.variant},
                "params": {kernel.layer: params}, **cell}
        m = Measurement(canonical_hash({"cache": header, "key": entry_key, "entry": entry})[:32], job_id,
                        canonical_hash(spec), spec, sweep, git={"commit": None, "dirty": None}, sources={},
                        grid=GridPlace(job_key, index, len(entries), len(entries), job["search"]),
                        clocks={"sm_mhz": None, "memory_mhz": None}, environment=environment, profiler=IMPORTED_BY,
                        floors=kernel.floors, builds=[], kernels=[], memcpys=[], files={})
        _read_entry(m, entry, kernel.layer, path, f"cache[{entry_key!r}]")
        m.imported_from = f"{IMPORTED_BY}:{path}"
        measurements.append(m)
    counts = SettingCounts(valid=len(entries), measured=len(entries), resumed=0)
    return ResultFile(FORMAT, job_id, job_key, job, sweep, counts, started_at=measurements[0].started_at,
                      measurements=measurements)


def tunable_grid(path: Path, keys: list[str], entries: dict[str, dict]) -> tuple[dict[str, list], list[dict]]:
    """The job's grid (each tunable's values, in the order first met) and each entry's setting, in linear time:
    a dict per tunable, where a list's `in` made it quadratic (a 59 MB cache had not finished after 600 s). Equal
    values are one either way (1, 1.0 and true too). ConfigError where an entry lacks a tunable or its value is
    not one a -D macro takes."""
    grid: dict[str, dict[Any, None]] = {k: {} for k in keys}
    settings = []
    for entry_key, entry in entries.items():
        missing = [k for k in keys if k not in entry]
        if missing:
            raise ConfigError(f"{path}: cache[{entry_key!r}]: lacks the tunable {missing[0]!r} of tune_params_keys")
        setting = {k: entry[k] for k in keys}
        for k, value in setting.items():
            if not isinstance(value, (int, float, str)):  # bool is an int; a list, an object or null names no value
                raise ConfigError(f"{path}: cache[{entry_key!r}].{k}: expected a number or a string (a tunable's "
                                  f"value), got {json.dumps(value)[:60]}")
            grid[k][value] = None
        settings.append(setting)
    return {k: list(values) for k, values in grid.items()}, settings


def _read_entry(m: Measurement, entry: dict[str, Any], layer: str, path: Path, where: str) -> None:
    """What a cache entry says of its configuration, onto its Measurement: when, how long the compile, the timing and
    the check took, and its time and times as the layer's op time and samples, or failed with Kernel Tuner's error."""
    from convsweep.measure.record import Sample, Stopping, Timings

    m.started_at = _timestamp(entry.get("timestamp"), path, f"{where}.timestamp")
    compile_ms = entry.get("compile_time")
    m.timings = Timings(op_time_ms={layer: None},
                        compile_ms=None if compile_ms is None else _number(compile_ms, path, f"{where}.compile_time"))
    m.phases_s = {phase: _number(entry[key], path, f"{where}.{key}") / 1000.0
                  for phase, key in (("timed", "benchmark_time"), ("check", "verification_time")) if key in entry}
    error = kt_error(entry)
    if error is not None:
        m.status, m.error, m.samples = "failed", f"Kernel Tuner: {error}: the configuration {KT_ERRORS[error][1]}", []
        return
    m.timings.op_time_ms = {layer: _number(entry.get("time"), path, f"{where}.time")}
    times = entry.get("times") or []
    m.samples = [Sample("op_time_ms", layer, repeat, _number(value, path, f"{where}.times[{repeat}]"))
                 for repeat, value in enumerate(times if isinstance(times, list) else [times])]
    m.stopping = Stopping("fixed", "fixed", len(m.samples)) if m.samples else None
    m.status = "ok"
    m.note = "Kernel Tuner timed this kernel alone; " + (
        "it checked the outputs" if entry.get("verification_time") else "its outputs were not checked")


def import_cache(url: str | None, cache_path: str | Path, experiment: str = DEFAULT_EXPERIMENT,
                 network: str = DEFAULT_NETWORK, variant: str | None = None, layer: str | None = None,
                 batch: int | None = None) -> Imported:
    """Store every configuration of a Kernel Tuner cache file as a run of `experiment`, in one transaction, each
    marked as imported from it; a configuration stored already (the same file imported again) counts as unchanged."""
    from convsweep.store import ingest_result, open_store

    path = Path(cache_path)
    if _LONE_SURROGATE.search(str(path)):  # bytes of a name that are not UTF-8, as Python decodes argv
        raise ConfigError(f"{path}: expected a file name in UTF-8: it is stored with the runs (imported_from)")
    cache = read_cache(path)
    kernel = resolve_kernel(path, cache, network, variant, layer, batch)
    result = cache_result(path, cache, kernel, experiment)
    engine = open_store(url)
    try:
        report = ingest_result(engine, result.to_json(), str(path))
    finally:
        engine.dispose()
    return Imported(kernel, report.added, report.unchanged, dict(report.added_by_status))


# -- the command line -------------------------------------------------------------------------------------------
