"""experiments.yaml: validation against the workflow's JSON Schema and expansion into jobs.

A job (`JobSpec`) is one cell of the matrix and measures the tunable settings of that cell in one
process; each setting (`RunSpec`) is a run of its own. The job's hash names its file, so a resumed
sweep finds the results it already has and an edited one reruns exactly what changed; a setting's
hash (run_key) names its measurements in the store.

An error about the sweep file is one line `file:line: experiments.NAME.key: what was expected`, with
the nearest known name where a variant, dataset, network or key is unknown.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import asdict, dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convsweep.base import axes
from . import search as search_mod
from convsweep.base.axes import AXES, NAMES, OMITTED_AT_DEFAULT, Axis, job_id_part
from convsweep.base.errors import ConfigError, ConvsweepError, ShapeError
from convsweep.base.fileio import canonical_hash
from convsweep.base.paths import DEFAULT_DB_URL, ROOT, resolve_network_path
from convsweep.base.schema import did_you_mean, validate as validate_against
from convsweep.base.yamlio import ANY, line_of, read_yaml_file

if TYPE_CHECKING:  # a job imports this module first: a class's reader only where a spec names one
    from .classes import LeftOuts

# Values in a sweep (keys, list items, aliases expanded): the largest here has ~400. jsonschema checks
# ~30,000 values a second on this machine, so a config at the bound is still answered in under a second.
MAX_CONFIG_NODES = 20_000
MAX_JOBS = 20_000  # a sweep's jobs: twice the largest planned yet (10,003 in 25 s, docs/scaling.md)
DEADLINE_S = 300.0  # `deadline_s`'s default: the CPU reference's whole job at batch 10000 took 45 s on the lent host
# GPU memory of the largest GPU lent (an H200): a cell that needs more runs nowhere; the planner refuses it.
MAX_DEVICE_BYTES = 141 * 10**9


def _axis_field(axis: Axis) -> tuple:
    """An axis as a spec's field: its type (or None, where that is its default) and its default, if any."""
    kind = axis.type | None if axis.nullable else axis.type
    return (axis.name, kind) if axis.required else (axis.name, kind, field(default=axis.default))


def _cell_fields() -> list[tuple]:
    """Cell's fields: what a job and each of its settings share, the axes (convsweep.base.axes) among them."""
    return [("experiment", str), ("network", str), ("dataset", str | dict),
            ("variants", dict[str, str]),  # conv layer -> variant
            *(_axis_field(axis) for axis in AXES),
            ("repeats", int | str),  # timed passes, or "auto": until `stopping` says the median is known
            ("warmup", int), ("profiler", str),
            # repeats auto: max_noise, min_samples, min_time_s, timeout_s, max_samples
            ("stopping", dict | None, field(default=None)),
            # untimed passes after a timed part too short for NVML's energy counter
            ("energy_window_s", float, field(default=0.5)),
            # full, or fast: no caching test (convsweep.measure.integrity)
            ("checks", str, field(default="full")),
            ("sanitize", bool, field(default=False)),  # a checked pass under compute-sanitizer (sweep.sanitize)
            ("deadline_s", float, field(default=DEADLINE_S)),  # a pass that runs longer is killed (measure.deadline)
            # the class folder whose submissions' variants it names (docs/course.md), as classes.spec_folder has it
            ("submissions", str | None, field(default=None))]


def _join_class(cell) -> None:
    """A spec naming a class makes its variants known to this process's look-ups (convsweep.sweep.classes)."""
    if cell.submissions is not None:
        from .classes import join_class

        join_class(cell.submissions)


# One cell of the sweep matrix as a spec holds it: its experiment, network, dataset, variants and a value
# of each axis, and how it is timed. Keyword-only, so the axes' fields come from AXES in any order. Any to
# mypy, which cannot see fields made at run time.
Cell: Any = make_dataclass("Cell", _cell_fields(), frozen=True, kw_only=True,
                           namespace={"__module__": __name__, "__post_init__": _join_class})


@dataclass(frozen=True, kw_only=True)
class RunSpec(Cell):
    """One tunable setting of one job: what a run row is a measurement of. Its hash (run_key) names
    the setting across measurements, whichever grid or sample it was measured in."""

    params: dict[str, dict[str, Any]]  # conv layer -> tunable parameters (all of them)

    def to_dict(self) -> dict:
        return _without_defaults(asdict(self))

    @property
    def run_key(self) -> str:
        return canonical_hash(self.to_dict())

    @property
    def label(self) -> str:
        return _label(self.variants)


GRID_SEARCH = {"strategy": "grid"}


@dataclass(frozen=True, kw_only=True)
class JobSpec(Cell):
    """One cell of the sweep matrix (conv layer -> variant, a value of each axis) and the tunable grid
    of its variants: one process measures every setting the search picks from the grid, each setting a
    run of its own (`runs`).

    `grid` is a list of {"layers": [...], "values": {tunable: [values]}}: each entry's setting
    applies to all its layers (a variant's grid in experiments.yaml ties every layer it runs),
    so the settings are the product of the entries' combinations, less those the registry's
    restrictions or a layer's shape rule out. `search` is {"strategy": "grid"} (all of them),
    {"strategy": "random", "budget": N, "seed": S} (a seeded sample) or a guided strategy with the same
    keys, which measures N of them as convsweep.sweep.search proposes.
    """

    grid: list[dict]
    search: dict = field(default_factory=lambda: dict(GRID_SEARCH))
    arch: str = "auto"  # NVRTC's target: auto is the GPU's own (sm_90a, say, for arch-specific features)
    sweep: dict = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("sweep")
        return _without_defaults(d)

    @property
    def job_key(self) -> str:
        return canonical_hash(self.to_dict())

    @property
    def label(self) -> str:
        return _label(self.variants)

    @property
    def job_id(self) -> str:
        """'fp16_sliding_window-b10000-s1-pinned-cold-0123456789': the label, the axes, the key's start."""
        return f"{self.label}{job_id_part({name: getattr(self, name) for name in NAMES})}-{self.job_key[:10]}"

    @property
    def winners_id(self) -> str:
        """The confirm job of this job's cell (convsweep.measure.confirm): 'winners-b10000-s1-0123456789', the same
        for every job of the experiment that differs from it only in variant and tunables."""
        cell = {k: v for k, v in self.to_dict().items() if k not in ("variants", "grid", "search")}
        return f"winners-b{self.batch}-s{self.streams}-{canonical_hash(cell)[:10]}"

    @classmethod
    def from_dict(cls, d: dict, sweep: dict | None = None) -> JobSpec:
        return cls(**{k: v for k, v in d.items() if k != "sweep"}, sweep=sweep or d.get("sweep", {}))

    @classmethod
    def for_run(cls, run: RunSpec, sweep: dict | None = None) -> JobSpec:
        """The job that measures exactly one setting (a lone job: the bench harness, tests)."""
        grid = [{"layers": [layer], "values": {k: [v] for k, v in (run.params.get(layer) or {}).items()}}
                for layer in run.variants]
        fields = {k: v for k, v in run.to_dict().items() if k != "params"}
        return cls(**fields, grid=grid, sweep=sweep or {})

    def settings(self) -> Settings:
        """The settings this job measures (grid order) and how many the grid holds: computed from
        the registry and the network, the same in the planner and in the job."""
        return choose_settings(self.network, self.variants, self.grid, self.search, f"job {self.job_id}",
                               self.submissions)

    def runs(self) -> list[RunSpec]:
        common = {k: v for k, v in self.to_dict().items() if k not in ("grid", "search", "arch")}
        return [RunSpec(**common, params=params) for params in self.settings().chosen]


# Keys left out of a spec's dict at these values, so specs written before they existed keep their
# hashes: the axes' defaults (the automatic chunking, warm caches), the GPU's own architecture, a
# fixed number of repeats, the energy window, no class.
_OMITTED_DEFAULTS = {**OMITTED_AT_DEFAULT, "arch": "auto", "stopping": None, "energy_window_s": 0.5, "checks": "full",
                     "sanitize": False, "deadline_s": DEADLINE_S, "submissions": None}


def _without_defaults(d: dict) -> dict:
    return {k: v for k, v in d.items() if not (k in _OMITTED_DEFAULTS and v == _OMITTED_DEFAULTS[k])}


def tunables_text(params: dict[str, dict]) -> str:
    """'conv1 BLOCK=64; conv2 BLOCK=64' (progress lines and summaries), or 'defaults'."""
    return "; ".join(f"{layer} " + ",".join(f"{k}={v}" for k, v in p.items()) for layer, p in params.items() if p) \
        or "defaults"


def _label(variants: dict[str, str]) -> str:
    names = sorted(set(variants.values()))
    return names[0] if len(names) == 1 else "mixed"


@dataclass(frozen=True)
class Settings:
    """What a job's search picked from its grid: `chosen` (conv layer -> tunables, in grid order)
    out of `valid` settings that the restrictions and the layers' shapes allow. For a guided search
    every valid setting is chosen, as a candidate: `budget` of them are measured, in the order it
    proposes them."""

    chosen: list[dict[str, dict]]
    valid: int
    guided: bool = False
    budget: int | None = None  # how many are measured; None: every chosen one


_SETTINGS: dict[str, Settings] = {}  # by the hash of choose_settings' arguments: the planner asks once per cell


def choose_settings(network_path: str, variants: dict[str, str], grid: list[dict], search: dict, where: str,
                    class_folder: str | None = None, net=None) -> Settings:
    """The valid settings of `grid` for this network (product of each entry's allowed combinations,
    those that fit every layer's shape), then the search's pick: all, or `max_settings` of them
    drawn with `seed` (the same draw for every batch and stream count of the cell), or all of them as
    a guided search's candidates. The variants: the registries' or the class's at `class_folder`; `net`: the network.
    One ConfigError line when nothing is left."""
    from convsweep.model.network import load_network
    from convsweep.model.variants import check_grid_size, get_variant

    key = canonical_hash([network_path, variants, grid, search, class_folder])
    if key in _SETTINGS:
        return _SETTINGS[key]
    registry = {name: get_variant(name, class_folder) for name in set(variants.values())}
    net = net or load_network(resolve_network_path(network_path))
    per_entry = []
    for i, entry in enumerate(grid):
        names = {variants[layer] for layer in entry["layers"]}
        if len(names) != 1:
            raise ConfigError(f"{where}: grid[{i}] ties layers {entry['layers']} that run different variants")
        variant = registry[names.pop()]
        per_entry.append([(entry["layers"], combo) for combo in
                          variant.param_combinations(entry["values"], f"{where}: params.{variant.name}")])
    try:
        shapes = _layer_shapes(net, variants, registry)
    except ShapeError as e:  # the layers a variant fuses do not follow its layer: no setting can fit
        raise ConfigError(f"{where}: {e}") from None
    check_grid_size(math.prod(len(combos) for combos in per_entry), where)  # layers' grids multiply
    valid, first_misfit, combos = [], None, 0
    for combo in itertools.product(*per_entry):
        combos += 1
        params: dict[str, dict] = {layer: {} for layer in variants}
        for layers, values in combo:
            for layer in layers:
                params[layer] = dict(values)
        try:
            _check_shapes(net, shapes, params)
        except ShapeError as e:
            first_misfit = first_misfit or str(e)
            continue
        valid.append(params)
    if not valid:
        raise ConfigError(f"{where}: {first_misfit}" if combos == 1 else
                          f"{where}: none of the {combos} settings of the grid fits; the first: {first_misfit}")
    chosen = [valid[i] for i in search_mod.up_front(search, len(valid))]
    guided = search_mod.is_guided(search)
    _SETTINGS[key] = Settings(chosen, len(valid), guided, search_mod.budget(search, len(valid)) if guided else None)
    return _SETTINGS[key]


def variant_label(variants: dict[str, str]) -> str:
    """How tables name a layer -> variant map: 'naive' when every layer runs naive, else
    'conv1=naive,conv2=tiled' in network order."""
    names = list(variants.values())
    if names and all(name == names[0] for name in names):
        return str(names[0])
    return ",".join(f"{layer}={name}" for layer, name in variants.items())


def validate(config: dict, source: str) -> dict:
    """Validate (and fill defaults into) a parsed experiments.yaml; one ConfigError line on the first problem.

    Snakemake parses the file itself, keeping the last of two equal keys and expanding aliases without
    bound, so where `source` is a file, convsweep's loader reads it again to refuse both with their line.
    The dict (which holds --config overrides too) is then bounded in size before the schema walks it."""
    yaml_file = Path(source) if Path(source).is_file() else None
    if yaml_file is not None:
        read_yaml_file(yaml_file)
    return validate_against(config, "experiments", source, max_nodes=MAX_CONFIG_NODES, yaml_file=yaml_file)


@dataclass(frozen=True)
class Config:
    path: Path
    data: dict

    @property
    def db_url(self) -> str:
        return os.environ.get("CONVSWEEP_DB") or self.data.get("db_url", DEFAULT_DB_URL)

    @property
    def results_dir(self) -> str:
        return self.data.get("results_dir", "results")

    @property
    def experiments(self) -> dict:
        return self.data["experiments"]


def load_config(path: str | os.PathLike) -> Config:
    path = Path(path)
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with an 'experiments' key")
    return Config(path, validate_against(data, "experiments", str(path), max_nodes=MAX_CONFIG_NODES, yaml_file=path))


def expand_config(config: Config | dict, source: str = "experiments.yaml") -> list[JobSpec]:
    """Every job of every experiment, in a stable order; errors name the file, the line and the key."""
    return expand(config, source)[0]


def expand(config: Config | dict, source: str = "experiments.yaml") -> tuple[list[JobSpec], LeftOuts]:
    """expand_config's jobs, and by experiment, the submissions of its class folder it leaves out (classes.LeftOut)."""
    from convsweep.model.variants import load_registry
    from .classes import LeftOuts

    if isinstance(config, dict):
        config = Config(Path(source), validate(config, source))
    registry = load_registry()
    _check_job_count(config)
    jobs: list[JobSpec] = []
    left_out = LeftOuts()
    for name, exp in config.experiments.items():
        try:
            jobs += _experiment_jobs(config, name, exp, registry, left_out)
        except ConfigError as e:
            raise ConfigError(_with_line(str(e), config, name)) from None
    if len(jobs) > MAX_JOBS:  # a class's jobs are counted as they are made
        raise ConfigError(f"{config.path}: {len(jobs):,} jobs; a sweep makes at most {MAX_JOBS:,}: split it")
    if not jobs:
        told = "".join(f"; every submission of {left.folder} is left out (`convsweep submissions check {left.folder}`)"
                       for left in left_out.values())
        raise ConfigError(f"{config.path}: the sweep matrix is empty{told}")
    seen: dict[str, JobSpec] = {}
    for job in jobs:
        seen.setdefault(job.job_id, job)
    return list(seen.values()), left_out


def _experiment_jobs(config: Config, name: str, exp: dict, registry, left_out: LeftOuts) -> list[JobSpec]:
    """One experiment's jobs, the submissions it leaves out put in `left_out`; errors begin `file: experiments.NAME`."""
    from convsweep.model import network as network_mod
    from convsweep.inputs.formats import FORMATS
    from convsweep.model.variants import unknown_variant
    from .classes import join_class, plan_class

    where = f"{config.path}: experiments.{name}"
    resolved = resolve_network_path(exp["network"], config.path.parent)
    if not resolved.is_file():
        nearest = _nearest_network(exp["network"], config.path.parent)
        raise ConfigError(f"{where}.network: no such file '{exp['network']}'{nearest}")
    net = network_mod.load_network(resolved)
    try:
        network_mod.check_weights(net)
    except ConvsweepError as e:
        raise ConfigError(f"{where}.network: {e}") from None
    _check_dataset(exp["dataset"], f"{where}.dataset")
    network = str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)
    conv_names = [layer.name for layer in net.conv_layers]
    search = _search(exp, f"{where}.search")
    sweep = {"experiment": name, "config_hash": canonical_hash(exp), "config_path": str(config.path)}
    if (refused := axes.refusal(exp)) is not None:
        raise ConfigError(f"{where}.{refused[0]}: {refused[1]}")
    for input_format in exp["input"]:
        if (why := FORMATS[input_format].refusal(net, exp["dataset"])) is not None:
            raise ConfigError(f"{where}.input: {why}")
    lookup = join_class(exp["submissions"]) if "submissions" in exp else None  # its submissions, read when asked
    for grid_name, values in exp.get("params", {}).items():
        try:
            variant = registry.get(grid_name) or (lookup(grid_name) if lookup else None)
        except ConfigError:  # a submission of the class that is left out: the sweep says why
            continue
        if variant is None:
            raise ConfigError(f"{where}.params.{grid_name}: {unknown_variant(grid_name, registry)}")
        for layer, layer_values in _per_layer(values, conv_names, f"{where}.params.{grid_name}").items():
            variant.param_combinations(  # names the bad key
                layer_values, f"{where}.params.{grid_name}" + (f".{layer}" if layer else ""))

    def jobs_of(entry: str | dict, at: str, known=registry, of_class: str | None = None) -> list[JobSpec]:
        layer_map = _layer_map(entry, net, known, at)
        grid = _grid(layer_map, conv_names, exp.get("params", {}), f"{where}.params")
        # Checked here, once per cell shape, so a bad grid stops the sweep while it is planned.
        choose_settings(network, layer_map, grid, search, at, of_class, net)
        on_gpu = not all(known[var].is_cpu for var in layer_map.values())
        steps = net.steps({layer: known[var].fuses for layer, var in layer_map.items() if not known[var].is_cpu})
        jobs = []
        for values in itertools.product(*([axis.from_config(v) for v in exp[axis.key]] for axis in AXES)):
            cell = dict(zip(NAMES, values))
            if not axes.applies(cell, on_gpu):
                continue
            if on_gpu:
                _check_device_memory(net, steps, cell["batch"], cell["streams"], cell["chunk_images"],
                                     f"{where}.batches")
            jobs.append(JobSpec(
                experiment=name, network=network, dataset=exp["dataset"], variants=layer_map, grid=grid, **cell,
                repeats=exp["repeats"], warmup=exp["warmup"], profiler=exp["profiler"],
                stopping=dict(exp["stopping"]) if exp["repeats"] == "auto" else None, search=search,
                energy_window_s=exp["energy_window_s"], checks=exp["checks"], sanitize=exp["sanitize"],
                deadline_s=float(exp["deadline_s"]), arch=config.data["arch"], submissions=of_class, sweep=sweep))
        return jobs

    jobs = [job for v, entry in enumerate(exp.get("variants", [])) for job in jobs_of(entry, f"{where}.variants[{v}]")]
    class_jobs, left = plan_class(lookup, lambda full, var, at: jobs_of(  # each variant its own jobs
        full, at, {**registry, full: var}, lookup.key), f"{where}.submissions") if lookup else ([], None)
    left_out.update({name: left} if left else {})
    return jobs + class_jobs


# A key path's tail after `experiments.NAME` (`.params.naive.conv1.BLOCK`, `.variants[1]`), then `: `: the keys,
# layers, variants and tunables in it are identifiers (schema), so it reads back unambiguously.
_KEYS_AFTER_NAME = re.compile(r"((?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])*): ")
_KEY = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]")


def _with_line(message: str, config: Config, name: str) -> str:
    """`file: experiments.NAME.key.path: ...` as `file:LINE: experiments.NAME.key.path: ...`, the line of
    that key (or list item) in the file, where the file holds what the checked config holds there.
    The modules the expansion calls (variants, search, axes) build their messages on the `where` they
    are given, so the key path is read back from the message; any other message is left as it is."""
    head = f"{config.path}: experiments.{name}"
    tail = _KEYS_AFTER_NAME.match(message, len(head)) if message.startswith(head) else None
    if tail is None:
        return message
    keys = ["experiments", name, *(key or int(index) for key, index in _KEY.findall(tail.group(1)))]
    line = line_of(config.path, keys, _value_at(config.data, keys))
    return message if line is None else f"{config.path}:{line}: {message[len(str(config.path)) + 2:]}"


def _value_at(data: Any, keys: list) -> Any:
    """What `data` holds at a key path (ANY where it holds nothing: line_of then takes any value)."""
    for key in keys:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return ANY
    return data


def _check_dataset(dataset: str | dict, where: str) -> None:
    """convsweep.inputs.data's check of the dataset, with the nearest known name for a misspelled one."""
    from convsweep.inputs.data import DATASETS, RANDOM, check_dataset

    try:
        check_dataset(dataset)
    except ConvsweepError as e:
        hint = did_you_mean(dataset, [*DATASETS, RANDOM]) if isinstance(dataset, str) else ""
        raise ConfigError(f"{where}: {e}{hint}") from None


_MAX_LISTED_FILES = 1000  # of a directory searched for a misspelled network's name


def _nearest_network(value: str, base_dir: Path) -> str:
    """For a network file that is not there, the nearest names of the YAML files where resolve_network_path
    looked, written as the sweep wrote its own (`; did you mean 'networks/lenet86.yaml'?`)."""
    given = Path(value)
    folders = [given.parent] if given.is_absolute() else [base_dir / given.parent, ROOT / given.parent]
    names = {path.name for folder in dict.fromkeys(folders) if folder.is_dir()
             for path in itertools.islice(folder.glob("*.y*ml"), _MAX_LISTED_FILES)}
    return did_you_mean(given.name, names, shown=lambda name: given.with_name(name))


def _check_job_count(config: Config) -> None:
    """Refuse a sweep of more than MAX_JOBS jobs, counted from its axes' lengths before any is made."""
    keys = ("variants", *(axis.key for axis in AXES))
    total = 0
    for name, exp in config.experiments.items():
        total += math.prod(len(exp.get(key, ())) for key in keys)
        if total > MAX_JOBS:
            raise ConfigError(_with_line(f"{config.path}: experiments.{name}: the sweep's axes ({' x '.join(keys)}) "
                                         f"multiply to more than {MAX_JOBS:,} jobs; split it, or measure more "
                                         "settings per job", config, name))


def device_bytes(net, steps, batch: int, streams: int, chunk_images: int | None) -> int:
    """A lower bound of the GPU memory a job of this cell allocates (convsweep.measure.runner): the batch's
    input and logits, each stream's lane of layer outputs for one chunk, and the weights."""
    from convsweep.model.variants import DTYPES

    # The chunk as runner.pass_chunks cuts it (not imported: the runner brings CUDA's modules with it).
    chunk = min(chunk_images or math.ceil(batch / (1 if streams == 1 else min(batch, 4 * streams))), batch)
    outputs = sum(math.prod(step.last.out_shape) for step in steps if step.layer.kind.owns_output)
    weights = sum(math.prod(shape) for layer in net.layers for shape in layer.kind.weights(layer).values())
    images = math.prod(net.input_shape) + math.prod(net.layers[-1].out_shape)
    return DTYPES[net.dtype] * (batch * images + streams * chunk * outputs + weights)


def _check_device_memory(net, steps, batch: int, streams: int, chunk_images: int | None, where: str) -> None:
    need = device_bytes(net, steps, batch, streams, chunk_images)
    if need > MAX_DEVICE_BYTES:
        raise ConfigError(f"{where}: batch {batch:,} at {streams} stream(s) needs at least {need / 1e9:,.0f} GB of GPU "
                          f"memory for {net.path.name} (input, layer outputs, weights); the largest GPU here has "
                          f"{MAX_DEVICE_BYTES / 1e9:.0f} GB")


def _search(exp: dict, where: str) -> dict:
    """The experiment's search; the schema has checked its keys and types."""
    search = dict(exp["search"])
    search_mod.check(search, where)
    return search


def _check_fits(net, layer_name: str, variant, where: str) -> None:
    """A variant's element types and fused layers must match the network, whatever the batch."""
    if variant.is_cpu:
        return
    if net.dtype not in variant.dtypes:
        raise ConfigError(f"{where}: variant '{variant.name}' computes {'/'.join(variant.dtypes)}, "
                          f"but {net.path.name} is {net.dtype}")
    try:
        net.fused_layers(layer_name, variant.fuses)
    except ShapeError as e:
        raise ConfigError(f"{where}: {e}") from None


def _per_layer(values: dict, conv_names: list[str], where: str) -> dict[str | None, dict[str, list]]:
    """A variant's `params` as value lists per conv layer: {None: grid} when its layers share one grid
    ({PR: [1, 2]}); {conv1: grid, conv2: grid} when each layer has its own ({conv1: {PR: 2}, conv2:
    {PR: [1, 2]}}; a single value stands for a list of one). One line when the two forms are mixed."""
    layers = [key for key in values if key in conv_names]
    if not layers:
        return {None: values}
    if len(layers) != len(values):
        tunables = ", ".join(key for key in values if key not in conv_names)
        raise ConfigError(f"{where}: give tunables ({tunables}) either for all layers or under each conv layer "
                          f"({', '.join(layers)}), not both")
    return {layer: {name: value if isinstance(value, list) else [value] for name, value in grid.items()}
            for layer, grid in values.items()}


def _grid(layer_map: dict[str, str], conv_names: list[str], params: dict, where: str) -> list[dict]:
    """A cell's tunable grid: one entry per variant whose layers share values, or one per layer where
    the variant's params are given per layer (a layer not named there keeps the defaults)."""
    grid = []
    for var in dict.fromkeys(layer_map.values()):
        layers = [layer for layer in layer_map if layer_map[layer] == var]
        per_layer = _per_layer(params.get(var, {}), conv_names, f"{where}.{var}")
        if None in per_layer:
            grid.append({"layers": layers, "values": per_layer[None]})
        else:
            grid += [{"layers": [layer], "values": per_layer.get(layer, {})} for layer in layers]
    return grid


def _layer_shapes(net, layer_map: dict[str, str], registry) -> list[tuple[str, Any, Any]]:
    """(layer, variant, one-image shape) of each GPU layer that has a kernel of its own (a layer an
    earlier layer's fused network computes has none): the same for every setting of a grid."""
    timed = [(name, registry[v]) for name, v in layer_map.items() if not registry[v].is_cpu]
    swallowed = net.swallowed({name: variant.fuses for name, variant in timed})
    return [(name, variant, net.variant_shape(net.layer(name), variant.fuses)) for name, variant in timed
            if name not in swallowed]


def _check_shapes(net, shapes: list[tuple[str, Any, Any]], params: dict[str, dict]) -> None:
    """Each layer's shape (one image; batch-dependent limits are the job's to find) must meet its
    variant's registry constraints with these tunables; ShapeError names the layer and the rule."""
    for name, variant, shape in shapes:
        try:
            variant.check_shape(shape, params[name])
        except ShapeError as e:
            raise ShapeError(f"layer {name} of {net.path.name}: {e}") from None


def _layer_map(entry: str | dict, net, registry, where: str) -> dict[str, str]:
    """conv layer -> variant name for one `variants` entry, checked against the registry and the
    network. A conv layer that an earlier layer's variant computes too (a fused network swallows the
    later convs) has no entry of its own: a string entry covers it, a mapping may leave it out."""
    from convsweep.model.variants import unknown_variant

    conv_names = [layer.name for layer in net.conv_layers]
    if isinstance(entry, str):
        if entry not in registry:
            raise ConfigError(f"{where}: {unknown_variant(entry, registry)}")
        given = {name: entry for name in conv_names}
    else:
        unknown = [layer for layer in entry if layer not in conv_names]
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown layer '{unknown[0]}' "
                              f"(conv layers: {', '.join(conv_names)})")
        given = dict(entry)
        for layer, var in given.items():
            if var not in registry:
                raise ConfigError(f"{where}.{layer}: {unknown_variant(var, registry)}")
    layer_map: dict[str, str] = {}
    swallowed: dict[str, str] = {}  # conv layer -> the earlier layer whose variant computes it
    for name in conv_names:
        if name in swallowed:
            owner = swallowed[name]
            if given.get(name, layer_map[owner]) != layer_map[owner]:
                raise ConfigError(f"{where}.{name}: layer {name} is computed by {owner}'s variant "
                                  f"'{layer_map[owner]}' (it fuses the layers after {owner}); give {name} no variant "
                                  "or the same one")
            continue
        if name not in given:
            raise ConfigError(f"{where}: no variant for layer '{name}'")
        layer_map[name] = given[name]
        variant = registry[given[name]]
        _check_fits(net, name, variant, where)
        if not variant.is_cpu:
            swallowed.update({layer.name: name for layer in net.fused_layers(name, variant.fuses) if layer.is_conv})
    return layer_map
