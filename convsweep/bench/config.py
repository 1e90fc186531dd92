"""The bench file (bench/default.yaml): what `convsweep bench` times and the targets it judges.

Its keys, types and defaults are workflow/schemas/bench.schema.yaml; what needs other files (the
network's layers, the registry's variants) is checked here. Every problem is one ConfigError line
naming the file and the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convsweep.base.errors import ConfigError, ConvsweepError
from convsweep.inputs.formats import FORMATS
from convsweep.model.network import load_network
from convsweep.base.paths import ROOT, resolve_network_path
from convsweep.base.schema import load_schema, validate
from convsweep.model.variants import load_registry
from convsweep.base.yamlio import read_yaml_file

DEFAULT_CONFIG = "bench/default.yaml"


@dataclass(frozen=True)
class Candidate:
    layer: str
    variant: str
    params: dict  # as written in the file
    resolved: dict  # every tunable, defaults filled in


@dataclass(frozen=True)
class BenchConfig:
    path: Path
    network_path: Path
    network: Any  # convsweep.model.network.Network
    dataset: str
    batch: int
    repeats: int
    warmup: int
    seed: int
    check_images: int
    copy_mib: int
    cudnn_benchmark: bool
    candidates: dict  # conv layer -> [Candidate]
    networks: tuple  # Candidates of whole-network variants (their layer: the first conv)
    end_to_end: dict  # streams, host_memory, chunk_images, graph, small_batch
    harness: dict  # repeats, warmup
    targets: dict  # batch, device, ms


def load_bench_config(path: str | Path = DEFAULT_CONFIG) -> BenchConfig:
    """Read a bench file, check it against workflow/schemas/bench.schema.yaml (which fills the
    defaults in), then against the network and the registry; every problem is one ConfigError line."""
    path = Path(path)
    if not path.is_file() and not path.is_absolute() and (ROOT / path).is_file():
        path = ROOT / path
    f = str(path)
    raw = validate(read_yaml_file(path), "bench", f)

    net_path = resolve_network_path(raw["network"], path.parent)
    if not net_path.is_file():
        raise ConfigError(f"{f}: network: expected an existing network YAML, got {raw['network']!r}")
    network = load_network(net_path)
    if network.dtype != "float32":
        raise ConfigError(f"{f}: network: expected a float32 network (the bench times float32 kernels), "
                          f"got {network.dtype} in {raw['network']}")
    conv_names = [layer.name for layer in network.conv_layers]
    registry = load_registry()
    candidates = _candidates(raw["candidates"], network, conv_names, registry, f)
    networks = tuple(_candidate(entry, conv_names[0], network, registry, f"{f}: networks[{i}]", whole=True)
                     for i, entry in enumerate(raw["networks"]))

    e2e = raw["end_to_end"]
    for i, name in enumerate(e2e["inputs"]):
        if name not in FORMATS:
            raise ConfigError(f"{f}: end_to_end.inputs[{i}]: expected one of {', '.join(FORMATS)}, got {name!r}")
        if (why := FORMATS[name].refusal(network, raw["dataset"])) is not None:
            raise ConfigError(f"{f}: end_to_end.inputs[{i}]: {why}")
    if e2e["graph"] and e2e["host_memory"] == "pageable":
        raise ConfigError(f"{f}: end_to_end.graph: a CUDA graph cannot capture copies from pageable memory: "
                          "expected host_memory pinned or registered, or graph: false")

    t = raw["targets"]
    rows = tuple(load_schema("bench")["properties"]["targets"]["properties"]["ms"]["properties"])
    ms = {}
    for key, value in t["ms"].items():
        if key not in conv_names and key not in rows:
            raise ConfigError(f"{f}: targets.ms.{key}: unknown key (expected a conv layer of {network.name} "
                              f"({', '.join(conv_names)}) or one of {', '.join(rows)})")
        if key.startswith("end_to_end") and isinstance(value, dict):
            unknown = sorted(set(value) - set(FORMATS))
            if unknown:
                raise ConfigError(f"{f}: targets.ms.{key}.{unknown[0]}: expected an input format "
                                  f"({', '.join(FORMATS)})")
        ms[key] = {p: float(v) for p, v in value.items()} if isinstance(value, dict) else float(value)
    targets = {"batch": t.get("batch", raw["batch"]), "device": t["device"], "ms": ms}

    return BenchConfig(path=path, network_path=net_path, network=network, dataset=raw["dataset"],
                       batch=raw["batch"], repeats=raw["repeats"], warmup=raw["warmup"], seed=raw["seed"],
                       check_images=raw["check_images"], copy_mib=raw["copy_mib"],
                       cudnn_benchmark=raw["cudnn_benchmark"], candidates=candidates, networks=networks,
                       end_to_end=e2e, harness=raw["harness"], targets=targets)


def _candidates(raw: dict, network, conv_names: list[str], registry: dict, f: str) -> dict[str, list[Candidate]]:
    """Each layer's candidates, checked against the network (a conv layer, the layers a variant
    fuses follow it, the shape fits) and the registry (a GPU variant, its tunables)."""
    candidates: dict[str, list[Candidate]] = {}
    for layer_name, entries in raw.items():
        where = f"{f}: candidates.{layer_name}"
        if layer_name not in conv_names:
            raise ConfigError(f"{where}: expected a conv layer of {network.name} ({', '.join(conv_names)})")
        candidates[layer_name] = [_candidate(entry, layer_name, network, registry, f"{where}[{i}]")
                                  for i, entry in enumerate(entries)]
    return candidates


def _candidate(entry, layer_name: str, network, registry: dict, at: str, whole: bool = False) -> Candidate:
    """One candidate at conv `layer_name`: a GPU variant whose tunables and fused layers fit there;
    `whole`: one that runs the rest of the network (networks:), else one that does not (candidates:)."""
    if isinstance(entry, str):  # shorthand: a bare variant name
        entry = {"variant": entry, "params": {}}
    name = entry["variant"]
    if name not in registry:
        raise ConfigError(f"{at}.variant: unknown variant {name!r} (known: {', '.join(sorted(registry))})")
    var = registry[name]
    if var.is_cpu:
        raise ConfigError(f"{at}.variant: expected a GPU variant, got {name!r} (it runs on the CPU)")
    if var.fuses_tail != whole:
        raise ConfigError(f"{at}.variant: {name!r} " + ("computes one conv layer: list it under candidates" if whole else
                                                         "runs the whole network: list it under networks"))
    resolved = var.resolve_params(entry["params"], f"{at}.params")
    try:
        var.check_shape(network.variant_shape(network.layer(layer_name), var.fuses), resolved)
    except ConvsweepError as e:
        raise ConfigError(f"{at}.variant: {e}") from None
    return Candidate(layer_name, name, dict(entry["params"]), resolved)
