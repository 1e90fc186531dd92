"""experiments.yaml: validation against the workflow's JSON Schema and expansion into jobs.

A job is a pure function of its `JobSpec`; the spec's hash names the job, so a resumed sweep
finds the results it already has and an edited one reruns exactly what changed.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, ShapeError
from .fileio import canonical_hash
from .paths import DEFAULT_DB_URL, ROOT, resolve_network_path
from .schema import validate as validate_against
from .yamlio import read_yaml_file


@dataclass(frozen=True)
class JobSpec:
    """Everything that defines one job; two equal specs are the same job."""

    experiment: str
    network: str
    dataset: str | dict
    variants: dict[str, str]  # conv layer -> variant
    params: dict[str, dict[str, Any]]  # conv layer -> tunable parameters (all of them)
    batch: int
    streams: int
    host_memory: str
    repeats: int
    warmup: int
    profiler: str
    chunk_images: int | None = None  # images per pipeline chunk; None: several chunks per stream
    sweep: dict = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("sweep")
        if d["chunk_images"] is None:  # the automatic chunking keeps the run keys it always had
            d.pop("chunk_images")
        return d

    @property
    def run_key(self) -> str:
        return canonical_hash(self.to_dict())

    @property
    def label(self) -> str:
        names = sorted(set(self.variants.values()))
        return names[0] if len(names) == 1 else "mixed"

    @property
    def job_id(self) -> str:
        chunk = f"-c{self.chunk_images}" if self.chunk_images else ""
        return f"{self.label}-b{self.batch}-s{self.streams}{chunk}-{self.host_memory}-{self.run_key[:10]}"

    @classmethod
    def from_dict(cls, d: dict, sweep: dict | None = None) -> "JobSpec":
        return cls(**{k: v for k, v in d.items() if k != "sweep"}, sweep=sweep or d.get("sweep", {}))


def variant_label(variants: dict[str, str]) -> str:
    """How tables name a layer -> variant map: 'naive' when every layer runs naive, else
    'conv1=naive,conv2=tiled' in network order."""
    names = list(variants.values())
    if names and all(name == names[0] for name in names):
        return str(names[0])
    return ",".join(f"{layer}={name}" for layer, name in variants.items())


def validate(config: dict, source: str) -> dict:
    """Validate (and fill defaults into) a parsed experiments.yaml; one ConfigError line on the first problem."""
    return validate_against(config, "experiments", source)


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
    return Config(path, validate(data, str(path)))


def expand_config(config: Config | dict, source: str = "experiments.yaml") -> list[JobSpec]:
    """Every job of every experiment, in a stable order; errors name the file and key."""
    from . import network as network_mod
    from .variants import load_registry

    if isinstance(config, dict):
        config = Config(Path(source), validate(config, source))
    registry = load_registry()
    base_dir = config.path.parent
    jobs: list[JobSpec] = []
    for name, exp in config.experiments.items():
        where = f"{config.path}: experiments.{name}"
        resolved = resolve_network_path(exp["network"], base_dir)
        net = network_mod.load_network(resolved)
        conv_names = [layer.name for layer in net.conv_layers]
        sweep = {"experiment": name, "config_hash": canonical_hash(exp), "config_path": str(config.path)}
        for v, entry in enumerate(exp["variants"]):
            layer_map = _layer_map(entry, conv_names, f"{where}.variants[{v}]")
            for var in set(layer_map.values()):
                if var not in registry:
                    raise ConfigError(f"{where}.variants[{v}]: unknown variant '{var}' (known: {', '.join(sorted(registry))})")
            for layer in net.conv_layers:
                _check_fits(net, layer.name, registry[layer_map[layer.name]], f"{where}.variants[{v}]")
            for grid_name in exp.get("params", {}):
                if grid_name not in registry:
                    raise ConfigError(f"{where}.params.{grid_name}: unknown variant '{grid_name}'")
            for params in _param_grid(layer_map, exp.get("params", {}), registry, f"{where}.params"):
                _check_shapes(net, layer_map, params, registry, f"{where}.variants[{v}]")
                for batch, streams, memory, chunk in itertools.product(exp["batches"], exp["streams"], exp["host_memory"],
                                                                       exp["chunk_images"]):
                    jobs.append(JobSpec(
                        experiment=name, network=str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved),
                        dataset=exp["dataset"], variants=layer_map, params=params, batch=batch,
                        streams=streams, host_memory=memory, repeats=exp["repeats"], warmup=exp["warmup"],
                        profiler=exp["profiler"], chunk_images=None if chunk == "auto" else chunk, sweep=sweep))
    if not jobs:
        raise ConfigError(f"{config.path}: the sweep matrix is empty")
    seen: dict[str, JobSpec] = {}
    for job in jobs:
        seen.setdefault(job.job_id, job)
    return list(seen.values())


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


def _check_shapes(net, layer_map: dict[str, str], params: dict[str, dict], registry, where: str) -> None:
    """Each layer's shape (one image; batch-dependent limits are the job's to find) must meet its
    variant's registry constraints: refused here with the constraint, not after a compile."""
    for layer in net.conv_layers:
        variant = registry[layer_map[layer.name]]
        if variant.is_cpu:
            continue
        shape = net.variant_shape(layer, variant.fuses)
        try:
            variant.check_shape(shape, params[layer.name])
        except ShapeError as e:
            raise ConfigError(f"{where}: layer {layer.name} of {net.path.name}: {e}") from None


def _layer_map(entry: str | dict, conv_names: list[str], where: str) -> dict[str, str]:
    if isinstance(entry, str):
        return {name: entry for name in conv_names}
    unknown = set(entry) - set(conv_names)
    if unknown:
        raise ConfigError(f"{where}: unknown layer '{sorted(unknown)[0]}' (conv layers: {', '.join(conv_names)})")
    missing = [n for n in conv_names if n not in entry]
    if missing:
        raise ConfigError(f"{where}: no variant for layer '{missing[0]}'")
    return {name: entry[name] for name in conv_names}


def _param_grid(layer_map: dict[str, str], grids: dict, registry, where: str) -> list[dict[str, dict]]:
    """The product of each used variant's grid; combinations its restrictions forbid are left out."""
    per_variant: dict[str, list[dict]] = {}
    for var in sorted(set(layer_map.values())):
        per_variant[var] = registry[var].param_combinations(grids.get(var, {}), f"{where}.{var}")
    out = []
    names = list(per_variant)
    for combo in itertools.product(*(per_variant[n] for n in names)):
        chosen = dict(zip(names, combo))
        out.append({layer: dict(chosen[var]) for layer, var in layer_map.items()})
    return out
