"""The variant registry (kernels/variants.yaml): what each .cu file is, its tunables and its launches.

Kernel source, tunable parameters and launch geometry are kept apart, as in Kernel Tuner: the
.cu file reads its parameters as macros, the registry says which values are allowed and how the
grid follows from the shape, and nothing here knows how a kernel computes.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .checks import TOLERANCE
from convsweep.base.errors import CompileError, ConfigError, ShapeError
from convsweep.base.expr import evaluate
from convsweep.base.fileio import canonical_hash
from convsweep.base.paths import REGISTRY_PATH, relative_to_root
from convsweep.base.schema import did_you_mean, validated_file

if TYPE_CHECKING:  # a job process imports this before numpy (which convsweep.model.layers needs)
    from .layers import Layer

DTYPES = {"float32": 4, "float64": 8}  # element types a network may store; variants list theirs (schema enum)
# Settings one job may measure: at 0.2-0.4 s a setting (docs/throughput.md) about an hour of GPU; the
# widest grid here is 48. The product of a grid's value lists is checked before it is enumerated.
MAX_SETTINGS = 10_000
# os.pathsep-separated variants.yaml files whose entries join the shipped registry (load_registry)
VARIANTS_ENV = "CONVSWEEP_VARIANTS"
# A variant's workspace per stream, at most: im2col's at batch 10000 on LeNet-86's conv2 is 9.1 GB; past the cap a
# setting is refused with a line (its job's `failed`, a submission's check) instead of asking the GPU for it.
WORKSPACE_CAP_BYTES = 16 * 2**30


@dataclass(frozen=True)
class ConvShape:
    """One conv layer's problem: y[B, M, H_out, W_out] from x[B, C, H, W] and k[M, C, K, K].

    P and PS are the window and stride of a max-pool fused into the conv (0: none), and dtype
    the element type of every tensor; both change what the kernel computes and is built as.
    `tail` holds the later layers a kernel that runs on to the network's end computes too (a fused
    network): their sizes are names too (tail_names), and y is then the last one's output.
    SRC_H, SRC_W and SRC_E are the rows, columns and bytes per element of what was shipped where the
    kernel absorbs the network's first layer (registry absorbs_input; 0: none): x is then the shipped
    batch, [B, C, SRC_H, SRC_W], and the kernel makes its [C, H, W] input from it.
    """

    B: int
    C: int
    M: int
    H: int
    W: int
    K: int
    S: int = 1
    P: int = 0
    PS: int = 0
    dtype: str = "float32"
    tail: tuple[Layer, ...] = ()
    SRC_H: int = 0
    SRC_W: int = 0
    SRC_E: int = 0

    @property
    def H_out(self) -> int:
        return (self.H - self.K) // self.S + 1

    @property
    def W_out(self) -> int:
        return (self.W - self.K) // self.S + 1

    @property
    def H_pool(self) -> int:
        return (self.H_out - self.P) // self.PS + 1 if self.P else self.H_out

    @property
    def W_pool(self) -> int:
        return (self.W_out - self.P) // self.PS + 1 if self.P else self.W_out

    @property
    def out_shape(self) -> tuple[int, ...]:
        """What the kernel writes: the pooled maps when a pool is fused, the last layer's output of a tail."""
        if self.tail:
            return (self.B, *self.tail[-1].out_shape)
        return (self.B, self.M, self.H_pool, self.W_pool)

    @property
    def E(self) -> int:
        """Bytes per element."""
        return DTYPES[self.dtype]

    def names(self) -> dict[str, int]:
        return {"B": self.B, "C": self.C, "M": self.M, "H": self.H, "W": self.W, "K": self.K,
                "S": self.S, "H_out": self.H_out, "W_out": self.W_out, "P": self.P, "PS": self.PS,
                "H_pool": self.H_pool, "W_pool": self.W_pool, "E": self.E, **tail_names(self.tail),
                "SRC_H": self.SRC_H, "SRC_W": self.SRC_W, "SRC_E": self.SRC_E}

    @property
    def flops(self) -> int:
        own = 2 * self.B * self.M * self.H_out * self.W_out * self.C * self.K * self.K
        return own + sum(self.B * layer_flops(layer) for layer in self.tail)

    @property
    def min_bytes(self) -> int:
        """Bytes the kernel must move at least: input (what was shipped, where it absorbs the first
        layer), weights and biases, and its output once each (a tail's intermediate maps need not leave the chip)."""
        weights = self.M * self.C * self.K * self.K + self.M + sum(layer_weights(layer) for layer in self.tail)
        read = self.B * self.C * (self.SRC_E * self.SRC_H * self.SRC_W if self.SRC_H else self.E * self.H * self.W)
        return read + self.E * (weights + math.prod(self.out_shape))


def tail_names(tail: tuple[Layer, ...]) -> dict[str, int]:
    """A tail's sizes as registry names, numbered by kind in layer order: the conv's own layer is
    conv 1 and its pool pool 1, so a tail's convs give M2, K2, S2, ..., its pools P2, PS2, ..., and
    its dense layers N1, N2, ... (out_features)."""
    names, count = {}, {"conv2d": 1, "maxpool2d": 1, "dense": 0}
    for layer in tail:
        if layer.type in count:
            count[layer.type] += 1
            n = count[layer.type]
            if layer.type == "conv2d":
                names.update({f"M{n}": layer.out_channels, f"K{n}": layer.kernel, f"S{n}": layer.stride})
            elif layer.type == "maxpool2d":
                names.update({f"P{n}": layer.size, f"PS{n}": layer.stride})
            else:
                names[f"N{n}"] = layer.out_features
    return cast(dict[str, int], names)  # each kind's sizes are set (convsweep.model.layers)


def layer_flops(layer: Layer) -> int:
    """Multiply-add FLOPs of one image through a conv or dense layer (0 for the others)."""
    if layer.type == "conv2d":
        c, k = layer.in_shape[0], cast(int, layer.kernel)
        return 2 * math.prod(layer.out_shape) * c * k * k
    if layer.type == "dense":
        return 2 * layer.in_shape[0] * cast(int, layer.out_features)
    return 0


def layer_weights(layer: Layer) -> int:
    """Weight and bias elements of a layer."""
    return sum(math.prod(shape) for shape in layer.kind.weights(layer).values())


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0


@dataclass(frozen=True)
class Variant:
    name: str
    precision: str
    description: str
    source: Path | None = None
    params: dict[str, dict] = field(default_factory=dict)
    restrictions: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    fuses: tuple[str, ...] = ()
    min_cc: float = 0.0
    launches: tuple[dict, ...] = ()
    compile_time: tuple[str, ...] = ()  # shape names compiled in as <NAME>_FIXED macros
    constant_weights: str | None = None  # __constant__ symbol the runner fills with k
    dtypes: tuple[str, ...] = ("float32",)  # element types the kernel is written for (conv_t)
    workspace: str | None = None  # bytes expression: a per-stream scratch buffer, passed after CONV_ARGS
    # {bytes: expression, launches: [...]}: the weights in the kernel's own form, made once when the runner
    # binds them (ConvOp.bind_weights); a buffer owned by the op, passed as PREPARED_ARG after the workspace
    prepare: dict | None = None
    # Kinds of a network's first layer (convsweep.model.layers: absorbable) the kernel computes itself where
    # that layer comes right before its conv: the step has no launch of its own and x is the shipped batch.
    absorbs_input: tuple[str, ...] = ()
    unit: str | None = None  # the arithmetic unit it computes on (convsweep.device.floors); None: its precision's
    # NVRTC targets the code needs (registry arch, e.g. sm_90a for wgmma); empty: any the GPU has
    arch: tuple[str, ...] = ()

    def __post_init__(self):
        if self.unit is None:
            object.__setattr__(self, "unit", self.precision)

    @property
    def entry_hash(self) -> str:
        """What the registry entry says about builds and launches (not its description): a job's
        parameter, so editing the entry re-measures the jobs of that variant alone."""
        entry = dataclasses.asdict(self)
        entry.pop("description")
        entry.pop("unit")  # what its floor is reckoned at, not what it builds or launches
        for key in ("absorbs_input", "arch", "prepare"):  # an entry without them keeps the hash it had before the keys
            if not entry[key]:
                entry.pop(key)
        entry["source"] = None if entry["source"] is None else Path(entry["source"]).name
        return canonical_hash(entry)[:16]

    def defines(self, params: dict, shape: ConvShape | None) -> dict[str, Any]:
        """The macros of one build: the tunables, plus the layer's shape where the kernel fixes it,
        plus CONV_T for a non-float32 element type."""
        macros = dict(params)
        if shape is not None and shape.dtype != "float32":
            macros["CONV_T"] = {"float64": "double"}[shape.dtype]
        if not self.compile_time:
            return macros
        if shape is None:
            raise ConfigError(f"variant '{self.name}' is compiled per layer shape ({', '.join(self.compile_time)}): "
                              "give the shape")
        names = shape.names()
        return {**macros, **{f"{n}_FIXED": names[n] for n in self.compile_time}}

    @property
    def fuses_pool(self) -> bool:
        return "maxpool" in self.fuses

    @property
    def fuses_tail(self) -> bool:
        """Whether the kernel runs on past its conv's relu and pool, through later layers (a fused
        network): those layers' weights follow POOL_ARGS (FUSED_WEIGHTS in common.cuh)."""
        return any(kind not in ("relu", "maxpool") for kind in self.fuses)

    def build_arch(self, target: str) -> str:
        """`target` (what a job or `--arch` asks for; auto resolves to the GPU's own, sm_90a on an H100) where
        the entry lists no arch or lists it; any other target is a CompileError of one line, before NVRTC
        would fail on the instructions less clearly (plain sm_90 has no wgmma)."""
        if not self.arch or target in self.arch:
            return target
        raise CompileError(f"variant '{self.name}' needs {' or '.join(self.arch)} (registry arch), got {target}")

    def workspace_bytes(self, shape: ConvShape, params: dict) -> int:
        if not self.workspace:
            return 0
        need = int(evaluate(self.workspace, {**shape.names(), **params}, f"{REGISTRY_PATH.name}: {self.name}.workspace"))
        if need > WORKSPACE_CAP_BYTES:
            raise ShapeError(f"variant '{self.name}': its workspace ({need} bytes for {shape}) is over the cap of "
                             f"{WORKSPACE_CAP_BYTES // 2**30} GiB a stream (WORKSPACE_CAP_BYTES)")
        return need

    @property
    def is_cpu(self) -> bool:
        return self.source is None

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.precision]

    @property
    def pass_kernel_names(self) -> tuple[str, ...]:
        """The kernels a forward pass launches (registry `launches`), not the `prepare` ones."""
        return tuple(dict.fromkeys(launch["kernel"] for launch in self.launches))

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """Every kernel the runner loads: the `prepare` launches' and a pass's."""
        prepare = self.prepare["launches"] if self.prepare else ()
        return tuple(dict.fromkeys((*(launch["kernel"] for launch in prepare), *self.pass_kernel_names)))

    def prepared_bytes(self, shape: ConvShape, params: dict) -> int:
        if not self.prepare:
            return 0
        return int(evaluate(self.prepare["bytes"], {**shape.names(), **params},
                            f"{REGISTRY_PATH.name}: {self.name}.prepare.bytes"))

    def defaults(self) -> dict[str, Any]:
        return {name: spec["default"] for name, spec in self.params.items()}

    def resolve_params(self, given: dict | None, where: str = "params") -> dict[str, Any]:
        """Defaults overlaid with `given`, each value checked against the allowed list and restrictions."""
        resolved = self.defaults()
        for name, value in (given or {}).items():
            self._check_value(name, value, where)
            resolved[name] = value
        for rule in self.restrictions:
            if not evaluate(rule, resolved, f"{REGISTRY_PATH.name}: {self.name}.restrictions"):
                raise ConfigError(f"{where}: {resolved} breaks the restriction '{rule}' of variant '{self.name}'")
        return resolved

    def param_combinations(self, grid: dict[str, list], where: str) -> list[dict[str, Any]]:
        """Every allowed combination of `grid` (unlisted tunables at their defaults); a grid of more
        than MAX_SETTINGS combinations is one ConfigError line, before any is made."""
        for name, values in grid.items():
            for value in values:
                self._check_value(name, value, where)
        check_grid_size(math.prod(len(values) for values in grid.values()), where)
        names = list(grid)
        combos, where_rule = [], f"{REGISTRY_PATH.name}: {self.name}.restrictions"
        for chosen in itertools.product(*(grid[n] for n in names)):
            params = {**self.defaults(), **dict(zip(names, chosen))}
            if all(evaluate(rule, params, where_rule) for rule in self.restrictions):
                combos.append(params)
        if not combos:
            raise ConfigError(f"{where}: no combination of the grid satisfies the restrictions {list(self.restrictions)}")
        return combos

    def _check_value(self, name, value, where):
        if name not in self.params:
            known = ", ".join(self.params) or "none"
            raise ConfigError(f"{where}.{name}: variant '{self.name}' has no tunable '{name}' (tunables: {known})")
        if value not in self.params[name]["values"]:
            raise ConfigError(f"{where}.{name}: {value!r} is not an allowed value (expected one of {self.params[name]['values']})")

    def all_combinations(self) -> list[dict[str, Any]]:
        """The whole registered grid: what CI compiles."""
        return self.param_combinations({n: spec["values"] for n, spec in self.params.items()}, self.name)

    def check_shape(self, shape: ConvShape, params: dict) -> None:
        """Refuse a shape the kernel cannot compute, naming the constraint, before anything runs."""
        if shape.H_out < 1 or shape.W_out < 1:
            raise ShapeError(f"variant '{self.name}': kernel {shape.K} is larger than the {shape.H}x{shape.W} input")
        if shape.dtype not in self.dtypes:
            raise ShapeError(f"variant '{self.name}' computes {'/'.join(self.dtypes)}, not {shape.dtype} "
                             f"(registry dtypes)")
        if self.fuses_pool != bool(shape.P):
            raise ShapeError(f"variant '{self.name}' fuses {'+'.join(self.fuses) or 'nothing'}: it needs "
                             f"{'a max-pool window (P > 0)' if self.fuses_pool else 'no fused pool'}, got P={shape.P}")
        if shape.SRC_H and not self.absorbs_input:
            raise ShapeError(f"variant '{self.name}' computes from the network's input, not from the shipped "
                             f"{shape.SRC_H}x{shape.SRC_W} images (registry absorbs_input)")
        if self.fuses_tail != bool(shape.tail):
            raise ShapeError(f"variant '{self.name}' " + (f"computes the layers after its conv too ({', '.join(self.fuses)}): "
                             "it runs in a network, not on a lone layer" if self.fuses_tail else
                             "computes one conv layer, not the layers after it"))
        if shape.P and (shape.H_out < shape.P or shape.W_out < shape.P):
            raise ShapeError(f"variant '{self.name}': pool window {shape.P} is larger than the {shape.H_out}x{shape.W_out} output")
        names = {**shape.names(), **params}
        for rule in self.constraints:
            if not evaluate(rule, names, f"{REGISTRY_PATH.name}: {self.name}.constraints"):
                raise ShapeError(f"variant '{self.name}' cannot handle {_fmt(shape)}: needs {rule}")

    def launch_plan(self, shape: ConvShape, params: dict) -> list[Launch]:
        return self._plan(self.launches, "launches", shape, params)

    def prepare_plan(self, shape: ConvShape, params: dict) -> list[Launch]:
        """The launches that write the prepared weights (registry prepare); none without it."""
        return self._plan(self.prepare["launches"], "prepare.launches", shape, params) if self.prepare else []

    def _plan(self, specs, key: str, shape: ConvShape, params: dict) -> list[Launch]:
        self.check_shape(shape, params)
        names = {**shape.names(), **params}
        plan = []
        for i, spec in enumerate(specs):
            where = f"{REGISTRY_PATH.name}: {self.name}.{key}[{i}]"
            grid = tuple(int(evaluate(e, names, where)) for e in spec["grid"])
            block = tuple(int(evaluate(e, names, where)) for e in spec["block"])
            plan.append(Launch(spec["kernel"], _dim3(grid), _dim3(block),
                               int(evaluate(spec.get("shared_bytes", 0), names, where))))
        return plan


def check_grid_size(settings: int, where: str) -> None:
    """Refuse a grid of more than MAX_SETTINGS settings (counted, not enumerated)."""
    if settings > MAX_SETTINGS:
        raise ConfigError(f"{where}: the grid holds {settings:,} settings (the product of its value lists); "
                          f"a job measures at most {MAX_SETTINGS:,}")


def _dim3(values: tuple[int, ...]) -> tuple[int, int, int]:
    return cast(tuple[int, int, int], tuple(values) + (1,) * (3 - len(values)))  # padded to three


def _fmt(shape: ConvShape) -> str:
    pool = f" P={shape.P} PS={shape.PS}" if shape.P else ""
    source = f" SRC_H={shape.SRC_H} SRC_W={shape.SRC_W} SRC_E={shape.SRC_E}" if shape.SRC_H else ""
    return f"B={shape.B} C={shape.C} M={shape.M} H={shape.H} W={shape.W} K={shape.K} S={shape.S}{pool}{source}"


def extra_registry_paths() -> tuple[Path, ...]:
    """The registries $CONVSWEEP_VARIANTS names (os.pathsep-separated; relative ones from the current
    directory), whose entries join the shipped ones: a user's own kernel directory, the tests' red team."""
    value = os.environ.get(VARIANTS_ENV, "")
    return tuple(Path(part).expanduser().absolute() for part in value.split(os.pathsep) if part.strip())


def load_registry(path: Path = REGISTRY_PATH) -> dict[str, Variant]:
    """The registry at `path` (the shipped one by default) joined by every file $CONVSWEEP_VARIANTS
    names; read once per version of those files and value of the variable (a test that sets it sees it,
    and `convsweep watch` sees a registry saved since)."""
    paths = (Path(path), *extra_registry_paths())
    return _load_registries(paths[0], paths[1:], tuple(_version(p) for p in paths))


def _version(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None  # missing: _load_registries says so, with the file's name
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=8)
def _load_registries(path: Path, extras: tuple[Path, ...], versions: tuple = ()) -> dict[str, Variant]:
    """`path`'s entries, then each extra file's; a missing file or a name two files define is one
    ConfigError line naming the file and the key."""
    registry = _read_registry(path, path.name)
    owner = dict.fromkeys(registry, relative_to_root(path))
    for extra in extras:
        shown = relative_to_root(extra)
        if not extra.is_file():
            raise ConfigError(f"{VARIANTS_ENV}: expected existing variants.yaml files, got {shown!r} (no such file)")
        for name, variant in _read_registry(extra, shown).items():
            if name in registry:
                raise ConfigError(f"{shown}: {name}: expected a name of its own, got one {owner[name]} defines already")
            registry[name], owner[name] = variant, shown
    return registry


def read_registry(path: Path, shown: str | None = None) -> dict[str, Variant]:
    """One registry file alone, neither joined to the shipped one nor remembered: a course's submission
    (convsweep.sweep.submissions). Errors as load_registry's, the file named by `shown` where given."""
    return _read_registry(Path(path), shown or relative_to_root(path))


def _read_registry(path: Path, shown: str) -> dict[str, Variant]:
    """One registry file, checked against workflow/schemas/variants.schema.yaml (which fills the
    defaults in), then for what a schema cannot see: the .cu files (beside the file) and the tunables'
    defaults. Errors begin with `shown`, the file as the person who named it knows it."""
    raw = _validated(path, shown)
    registry = {}
    for name, entry in raw.items():
        where = f"{shown}: {name}"
        source = None
        if not entry["cpu"]:
            source = path.parent / entry["source"]
            if not source.is_file():
                raise ConfigError(f"{where}.source: expected an existing .cu file in {path.parent.name}/, "
                                  f"got {entry['source']!r}")
        for pname, pspec in entry["params"].items():
            if pspec["default"] not in pspec["values"]:
                raise ConfigError(f"{where}.params.{pname}.default: expected one of {pspec['values']}, "
                                  f"got {json.dumps(pspec['default'])}")
        registry[name] = Variant(
            name=name, precision=entry["precision"], description=entry["description"], source=source,
            params=entry["params"], restrictions=tuple(entry["restrictions"]), constraints=tuple(entry["constraints"]),
            fuses=tuple(entry["fuses"]), dtypes=tuple(entry["dtypes"]),
            workspace=str(entry["workspace"]) if entry.get("workspace") else None, min_cc=float(entry["min_cc"]),
            launches=tuple(entry.get("launches", ())), compile_time=tuple(entry["compile_time"]),
            constant_weights=entry.get("constant_weights"), unit=entry.get("unit"), prepare=entry.get("prepare"),
            absorbs_input=tuple(entry["absorbs_input"]), arch=tuple(entry["arch"]))
    return registry


def _validated(path: Path, shown: str) -> dict:
    """validated_file's document; its errors name the file by `shown` where that is not the bare name
    (two registries are both called variants.yaml)."""
    try:
        return validated_file(path, "variants")
    except ConfigError as e:
        prefix = f"{path.name}: "
        if shown == path.name or not str(e).startswith(prefix):
            raise
        raise ConfigError(f"{shown}: {str(e)[len(prefix):]}") from None


def unknown_variant(name: str, registry: dict[str, Variant]) -> str:
    """What to say of a name the registry lacks: the nearest names (`unknown variant 'naiv'; did you mean
    'naive'?`), or where none is close, how many there are and where they are listed; never all of them."""
    if hint := did_you_mean(name, registry):
        return f"unknown variant '{name}'{hint}"
    listed = relative_to_root(REGISTRY_PATH) + (f" and ${VARIANTS_ENV}" if extra_registry_paths() else "")
    return f"unknown variant '{name}' ({len(registry)} known: see {listed})"


# A course's class folders (docs/course.md) whose submissions' variants this process finds by their class-wide names
# (`<id>__<name>`), each asked through the resolver the sweep wing joined it with (convsweep.sweep.classes: this
# wing reads no submission). A job's spec that names a class joins it, so that a job finds its own submission's
# variants, and only that submission is read.
ClassResolver = Callable[[str], Variant | None]
_CLASSES: dict[str, ClassResolver] = {}


def join_class(folder: str, resolve: ClassResolver) -> ClassResolver:
    """Look names up in the class at `folder` too, with `resolve`: the class-wide name's Variant (its source the
    checked copy NVRTC builds), None where the name is none of the class's, or a ConfigError saying why the
    submission it names cannot be used. A folder joined already keeps its resolver, which is returned."""
    return _CLASSES.setdefault(folder, resolve)


def find_variant(name: str, class_folder: str | None = None) -> Variant | None:
    """The variant of that name: a registry's (load_registry), else a joined class's (that of `class_folder`
    alone, where given); None where none has it. A name two joined classes both resolve is a ConfigError, never
    one of them."""
    registry = load_registry()
    if name in registry:
        return registry[name]
    folders = [class_folder] if class_folder is not None else list(_CLASSES)
    found = {folder: variant for folder in folders if folder in _CLASSES
             and (variant := _CLASSES[folder](name)) is not None}
    if len(found) > 1:
        raise ConfigError(f"variant '{name}': a submission of each of the classes {' and '.join(found)}: name one "
                          "class per sweep experiment")
    return next(iter(found.values()), None)


def get_variant(name: str, class_folder: str | None = None) -> Variant:
    """The variant of that name (find_variant); an unknown one is one ConfigError line with the nearest names."""
    found = find_variant(name, class_folder)
    if found is None:
        raise ConfigError(f"{REGISTRY_PATH.name}: {unknown_variant(name, load_registry())}")
    return found
