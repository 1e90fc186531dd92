"""`convsweep compile`: build a variant (or all) with NVRTC and show each kernel's resources."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import cast

from convsweep.base.errors import ConvsweepError
from .common import parse_params, resolve_arch


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a variant with NVRTC and show its resource usage")
    p.add_argument("variant", help="a variant name, or 'all'")
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="a tunable's value (default: the registry's)")
    p.add_argument("--all-params", action="store_true", help="every combination in the registry")
    p.add_argument("--define", action="append", metavar="NAME=VALUE",
                   help="a shape macro for variants compiled per layer shape (e.g. K_FIXED=7)")
    p.add_argument("--network", default="networks/lenet86.yaml",
                   help="variants compiled per layer shape, given no --define, are built for each conv layer of this "
                        "network that they fit (default: %(default)s)")
    p.add_argument("--layer", help="with --network: build for this conv layer only")
    p.add_argument("--arch", default="auto", help="e.g. sm_90; auto: this machine's GPU's own (sm_90a on an H100), "
                                                  "or sm_90a without one")
    p.add_argument("--out", help="write the builds (and, with --record-errors, the compile errors) as JSON")
    p.add_argument("--record-errors", action="store_true",
                   help="a kernel that does not compile is written to --out and the exit status stays 0: "
                        "a sweep then stores its jobs as failed with the compiler's message")
    p.set_defaults(func=run)


def run(args) -> None:
    from tabulate import tabulate

    from convsweep.device.compile import compile_source
    from convsweep.base.errors import CompileError
    from convsweep.base.fileio import write_json_atomic
    from convsweep.model.variants import get_variant, load_registry

    arch = resolve_arch(args.arch)
    names = sorted(v for v, var in load_registry().items() if not var.is_cpu) if args.variant == "all" else [args.variant]
    fixed = parse_params(args.define)
    rows, records, errors, unbuilt = [], [], [], []
    for name in names:
        var = get_variant(name)
        if var.is_cpu:
            raise ConvsweepError(f"variant '{name}' runs on the CPU: nothing to compile")
        if args.variant == "all" and var.arch and arch not in var.arch:  # one variant asked for: its one-line refusal
            print(f"{name}: not built: needs {' or '.join(var.arch)} (registry arch), not {arch}")
            continue
        combos = var.all_combinations() if args.all_params else [var.resolve_params(parse_params(args.param), "--param")]
        for params in combos:
            macro_sets = _build_macros(var, params, fixed, args.network, args.layer)
            if not macro_sets:
                unbuilt.append(name)
                continue
            for macros in macro_sets:
                try:
                    build = compile_source(cast(Path, var.source), name, macros, arch)  # not the CPU's
                except CompileError as e:
                    if not args.record_errors:
                        raise
                    errors.append(str(e))
                    print(f"convsweep: {e}", file=sys.stderr)
                    continue
                records.append(build.record())
                for k in build.kernels:
                    rows.append([name, json.dumps(macros, sort_keys=True), arch, k.name, k.registers, k.shared_bytes,
                                 k.local_bytes, k.spill_store_bytes, f"{build.compile_ms:.0f}",
                                 "hit" if build.cache_hit else "miss"])
    unbuilt = [name for name in dict.fromkeys(unbuilt) if not any(r["variant"] == name for r in records)]
    where = f"layer {args.layer} of {args.network}" if args.layer else f"any conv layer of {args.network}"
    if unbuilt and args.variant != "all":
        missing = " ".join(f"--define {n}_FIXED=..." for n in get_variant(args.variant).compile_time)
        raise ConvsweepError(f"variant '{args.variant}' fixes the layer shape at compile time and does not fit "
                             f"{where}: give {missing}")
    if args.out:
        write_json_atomic(Path(args.out), {"arch": arch, "builds": records, "errors": errors})
    print(tabulate(rows, headers=["variant", "macros", "arch", "kernel", "regs", "smem B", "local B", "spill B", "ms", "cache"],
                   tablefmt="github"))
    for name in unbuilt:
        print(f"{name}: not built: it fixes the layer shape at compile time and does not fit {where}; "
              "give its shape with --define, or another --network/--layer")


def _build_macros(var, params: dict, fixed: dict, network_path: str, layer_name: str | None) -> list[dict]:
    """The macro sets to build `var` with: its tunables and the --define values, and for a variant
    that compiles the layer shape in and was given none, one set per conv layer of the network
    (or the --layer) that the variant accepts, as a sweep would build it."""
    from convsweep.model.network import load_network
    from convsweep.base.paths import resolve_network_path

    if not var.compile_time or all(f"{n}_FIXED" in fixed for n in var.compile_time):
        return [{**params, **fixed}]
    network = load_network(resolve_network_path(network_path, Path.cwd()))
    layers = [network.layer(layer_name)] if layer_name else network.conv_layers
    sets = []
    for layer in layers:
        try:
            shape = network.variant_shape(layer, var.fuses)
            var.check_shape(shape, params)
        except ConvsweepError:  # a dtype, fusion or shape constraint the variant does not meet
            continue
        macros = {**var.defines(params, shape), **fixed}
        if macros not in sets:
            sets.append(macros)
    return sets
