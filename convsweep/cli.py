"""`convsweep`: the command line the Snakemake rules (and people) call.

Every error a user can cause, and a file the system would not read or write (a full disk), prints one
line, `convsweep: <what>`, and exits 2; a traceback only with --verbose. A reader that goes away
(`| head`) ends a command quietly.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

from . import confirm, kerneltuner, replay
from .cliargs import positive_int, positive_seconds, process_age
from .errors import ConvsweepError
from .paths import DEFAULT_DB_URL
from .figures import FIGURES, KINDS as PLOT_KINDS


def _parse_params(items: list[str], typed: bool = True) -> dict:
    """NAME=VALUE options as a dict; `typed`: a value that is JSON (a number, say) is parsed, else kept as text."""
    params = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConvsweepError(f"--param {item}: expected NAME=VALUE")
        try:
            params[name] = json.loads(value) if typed else value
        except json.JSONDecodeError:
            params[name] = value
    return params


def resolve_arch(arch: str) -> str:
    """'auto' is the GPU's own target (sm_90a on an H100), or the lent H100's where there is no GPU."""
    if arch != "auto":
        return arch
    from .gpu import Gpu, gpu_available
    from .provenance import NO_GPU_ARCH, host_gpu_arch

    if found := host_gpu_arch():
        return found

    ok, _ = gpu_available()
    if not ok:
        return NO_GPU_ARCH
    with Gpu() as gpu:
        return gpu.arch


def cmd_jobs(args) -> None:
    from .config import expand_config, load_config

    for job in expand_config(load_config(args.config)):
        settings = job.settings()
        if args.json:
            print(json.dumps({**job.to_dict(), "sweep": job.sweep, "job_id": job.job_id, "settings": settings.chosen}))
        else:
            print(f"{job.experiment}\t{job.job_id}\t{settings.budget or len(settings.chosen)} of {settings.valid} "
                  f"settings{' (' + job.search['strategy'] + ')' if settings.guided else ''}")


def _read_spec(args) -> dict:
    text = Path(args.spec_file).read_text() if args.spec_file else args.spec
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConvsweepError(f"--spec: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConvsweepError("--spec: expected a JSON object")
    return data


# What `convsweep jobs --json` adds to a spec: a job works both out from the rest, so they are checked or left out.
SPEC_EXTRAS = ("job_id", "settings")


def _job_spec(data: dict):
    from .config import JobSpec

    try:
        job = JobSpec.from_dict({k: v for k, v in data.items() if k not in SPEC_EXTRAS})
    except TypeError as e:
        raise ConvsweepError(f"--spec: not a job spec ({e})") from None
    if data.get("job_id", job.job_id) != job.job_id:
        raise ConvsweepError(f"--spec: job_id {data['job_id']!r} is not its spec's ({job.job_id}): "
                             "was the spec edited?")
    return job


def cmd_run_job(args) -> None:
    from .config import tunables_text
    from .job import run_job
    from .outcome import settings_not_ok
    from .record import Measurement

    def op_times(m: Measurement) -> dict[str, float | None]:
        assert m.timings is not None and m.timings.op_time_ms is not None  # an ok measurement's
        return m.timings.op_time_ms

    # A fresh process: the job takes its GPU's lock (a free one among several) before CUDA starts.
    result = run_job(_job_spec(_read_spec(args)), Path(args.out), process_age=process_age())
    measurements = result.measurements
    statuses = Counter(m.status for m in measurements)
    fastest = min((m for m in measurements if m.status == "ok"),
                  key=lambda m: sum(v or 0 for v in op_times(m).values()), default=None)
    best = ""
    if fastest is not None:
        ops = ", ".join(f"{k} {v:.3f} ms" for k, v in op_times(fastest).items() if v is not None)
        params = cast(dict, fastest.params)  # a job's setting has its tunables
        best = f"; fastest: {ops}" + (f" ({tunables_text(params)})" if len(measurements) > 1 else "")
    if said := settings_not_ok(measurements):  # whole: the table at the end of the sweep points at this log
        print("\n".join(said))
    # The job's last line: `convsweep watch` shows it for a job that finished.
    print(f"{result.job_id}: {len(measurements)} settings in {result.total_s:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())) + best)


def cmd_profile_job(args) -> None:
    from .ncu import run_profile_job

    result = run_profile_job(_job_spec(_read_spec(args)), Path(args.out), required=args.ncu == "true")
    if result["status"] == "ok":
        print(f"{result['job_id']}: {len(result['profiles'])} conv kernel launches profiled in {result['seconds']:.1f} s")
    else:  # never a failure of the sweep: the file says why, and ingest passes it on
        print(f"{result['job_id']}: not profiled: {result['reason']}")


def cmd_measure(args) -> None:
    from .job import measure_to_file

    data = _read_spec(args)
    settings = data.get("settings")  # None: every setting of the job
    measure_to_file(_job_spec(data.get("job", {})), None if settings is None else list(settings), Path(args.out),
                    [tuple(pair) for pair in data.get("told") or []])


def cmd_compile(args) -> None:
    from tabulate import tabulate

    from .compile import compile_source
    from .errors import CompileError
    from .fileio import write_json_atomic
    from .variants import get_variant, load_registry

    arch = resolve_arch(args.arch)
    names = sorted(v for v, var in load_registry().items() if not var.is_cpu) if args.variant == "all" else [args.variant]
    fixed = _parse_params(args.define)
    rows, records, errors, unbuilt = [], [], [], []
    for name in names:
        var = get_variant(name)
        if var.is_cpu:
            raise ConvsweepError(f"variant '{name}' runs on the CPU: nothing to compile")
        if args.variant == "all" and var.arch and arch not in var.arch:  # one variant asked for: its one-line refusal
            print(f"{name}: not built: needs {' or '.join(var.arch)} (registry arch), not {arch}")
            continue
        combos = var.all_combinations() if args.all_params else [var.resolve_params(_parse_params(args.param), "--param")]
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
    from .network import load_network
    from .paths import resolve_network_path

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


def cmd_ingest(args) -> None:
    from .fileio import write_json_atomic
    from .store import ingest_files, open_store

    files = _result_files(args.results)
    engine = open_store(args.db)
    t = time.perf_counter()
    report = ingest_files(engine, files)
    summary = {"added": report.added, "unchanged": report.unchanged, "failed": len(report.errors),
               "files": len(files), "seconds": round(time.perf_counter() - t, 3)}
    for error in report.errors:
        print(f"convsweep: {error}", file=sys.stderr)
    for skipped in report.skipped:
        print(f"skipped {skipped}")
    print(f"ingested {summary['files']} results: {report.added} added, {report.unchanged} already stored"
          + (f", {len(report.errors)} could not be stored" if report.errors else ""))
    if report.errors:
        raise SystemExit(1)
    if args.report:
        write_json_atomic(Path(args.report), summary)


def _result_files(paths: list[str]) -> list[Path]:
    """The files named, and in each folder named the *.json files directly in it, by name."""
    files = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return files


def cmd_query(args) -> None:
    from .questions import named_queries, run_question

    if args.list or not args.query:
        for name, description in named_queries():
            print(f"{name:12s} {description}")
        return
    params = _parse_params(args.param, typed=False)  # bound as text: the SQL casts what it compares
    print(run_question(args.db, args.query, fmt=args.format, params=params or None, timeout_s=args.timeout,
                       max_rows=args.max_rows))


def cmd_compare(args) -> None:
    from .compare import DEFAULT, compare, gate, render

    a, b = args.a or DEFAULT[0], args.b or DEFAULT[1]
    if not (args.a and args.b):
        print(f"compare: {a} -> {b}" + (": each job's newest measurement against the one before it"
                                         if (a, b) == DEFAULT else ""), file=sys.stderr)
    result = compare(args.db, a, b, metric=args.metric, threshold=args.threshold, db_b=args.db_b, cpu=args.cpu)
    print(render(result, args.format))
    failed, said = gate(result, args.fail_on)
    if args.fail_on != "never":
        print(f"compare: {said}", file=sys.stderr)
    if failed:
        raise SystemExit(1)


def cmd_watch(args) -> None:
    from .watch import WatchOptions, watch

    watch(WatchOptions(args.configfile, args.experiment, args.cores, args.cpu, args.threshold))


def cmd_report(args) -> None:
    from . import report
    from .fileio import checked_directory
    from .figures import draw
    from .paths import RESULTS_DIR, results_directory

    if not (args.out or args.markdown or args.html or args.tables or args.draw):
        raise ConvsweepError("report: nothing to write: give --out, --markdown, --html, --tables or --draw")
    figures = Path(args.figures) if args.figures else checked_directory(
        results_directory(args.experiment, "figures"), below=RESULTS_DIR)
    if args.draw:
        drawn = draw(args.db, args.experiment, figures, bench=args.bench)
        for path in drawn.paths:
            print(path)
        for kind, why in drawn.skipped:
            print(f"skipped {kind}: {why}")
    written = report.write(args.db, args.experiment, markdown=Path(args.markdown) if args.markdown else None,
                           page=Path(args.html) if args.html else None,
                           tables=Path(args.tables) if args.tables else None, figures_dir=figures,
                           summary=Path(args.out) if args.out else None, allow_empty=args.allow_empty)
    for path in written.paths:
        print(path)


def cmd_bench(args) -> None:
    from .bench import BenchOptions, format_report, load_bench_config, run_bench
    from .fileio import write_json_atomic
    from .store import ingest_ceiling, open_store

    config = load_bench_config(args.config)
    options = BenchOptions(batch=args.batch, repeats=args.repeats,
                           harness_profilers=("events", "nsys") if args.harness else (), ceilings_only=args.ceilings_only)
    engine = open_store(args.db) if args.db else None  # first: a store that cannot be used fails before the GPU work
    result = run_bench(config, options, log=lambda message: print(f"bench: {message}", file=sys.stderr, flush=True))
    if args.json:
        write_json_atomic(Path(args.json), result)
    print(format_report(result))
    if engine is not None:
        ingest_ceiling(engine, result, args.json)
        print(f"stored the rates of {result['device']}: the floors of its runs are reckoned at them")


def cmd_plot(args) -> None:
    from .figures import plot

    done = plot(args.kind, url=args.db, experiment=args.experiment, out=args.out, bench=args.bench)
    for path in done.paths:
        print(path)
    for kind, why in done.skipped:
        print(f"skipped {kind}: {why}")


def cmd_browse(args) -> None:
    from .browse import serve

    status = serve(args.db, port=args.port, host=args.host)
    if status:
        raise SystemExit(status)


DB_HELP = f"SQLAlchemy URL of the result store (default: $CONVSWEEP_DB or {DEFAULT_DB_URL})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convsweep", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    parser.add_argument("--checkout", metavar="DIR",
                        help="refuse to run unless this convsweep is the one in DIR (the Snakemake rules pass the "
                             "checkout they were planned from)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("jobs", help="list the jobs of a sweep")
    p.add_argument("--config", default="experiments.yaml", help="the sweep file (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON job spec per line, with its job_id")
    p.set_defaults(func=cmd_jobs)

    # `measure` is run-job's inner half under nsys: a command for convsweep itself, so it has no help line.
    for name, func, helptext in (("run-job", cmd_run_job, "run one job (every tunable setting of one cell of "
                                                          "the sweep) and write its result JSON"),
                                 ("profile-job", cmd_profile_job, "profile each conv kernel of a job's settings "
                                                                  "once with Nsight Compute (never a timed job)"),
                                 ("measure", cmd_measure, None)):
        p = sub.add_parser(name, **cast(dict[str, Any], {"help": helptext} if helptext else {}))
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--spec", help="the job spec as JSON: a line of `convsweep jobs --json`")
        src.add_argument("--spec-file", help="a file holding the job spec (a sweep writes one per job in "
                                             "<results>/<experiment>/specs/)")
        p.add_argument("--out", required=True, help="the result JSON to write")
        if name == "profile-job":
            p.add_argument("--ncu", choices=("true", "auto"), default="true",
                           help="the experiment's ncu: true fails the job without ncu, auto writes a skipped profile "
                                "saying so (default: %(default)s)")
        p.set_defaults(func=func)

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
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("ingest", help="store result JSONs in the database (idempotent)")
    p.add_argument("results", nargs="*", help="result JSON files written by run-job or profile-job, or folders of "
                                              "them (each *.json file directly in it)")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--report", metavar="FILE", help="write the counts (added, already stored, failed) as JSON")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("query", help="run SQL or a named query (db/queries/NAME.sql) read-only")
    p.add_argument("query", nargs="?", help="a query name or SQL text")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="a Markdown table, CSV or JSON rows (default: %(default)s)")
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="bind :NAME in the SQL")
    p.add_argument("--list", action="store_true", help="list the named queries")
    # The defaults are convsweep.query's DEFAULT_TIMEOUT_S and DEFAULT_MAX_ROWS (a test ties them), written
    # out so that building the parser does not import the database layer for every command.
    p.add_argument("--timeout", type=positive_seconds, default=5.0, metavar="SECONDS",
                   help="stop the query when it runs longer (default: %(default)s)")
    p.add_argument("--max-rows", type=positive_int, default=10_000, metavar="N",
                   help="show at most N rows, and say so when there were more (default: %(default)s)")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("bench", help="time the best variants beside cuDNN, the memory floor and the targets",
                       description="Times every candidate of the bench file per conv layer (checked against float64), "
                                   "the whole forward and the end-to-end pipeline with the best ones, and cuDNN on the "
                                   "same shapes when PyTorch is installed; prints ms, GB/s, GFLOP/s, the memory floor, "
                                   "ratios and the targets of the file.")
    p.add_argument("--config", default="bench/default.yaml", help="the bench file (default: %(default)s)")
    p.add_argument("--batch", type=positive_int, help="images per batch (default: the file's, 10000)")
    p.add_argument("--repeats", type=positive_int, help="timed runs per measurement (default: the file's, 20)")
    p.add_argument("--json", metavar="FILE", help="write every number (samples included) to FILE")
    p.add_argument("--harness", action="store_true",
                   help="also run a LeNet job twice with events and twice under nsys (if found) and judge the cached runs' total_s")
    p.add_argument("--ceilings-only", action="store_true", help="measure only the device's rates (copies each way, "
                   "matmul per unit), which the floors of its runs are reckoned at: seconds, not minutes")
    p.add_argument("--db", help="store the measured rates in this result store and reckon the floors of its runs on "
                                "this GPU at them (`convsweep ingest` of a --json file does the same)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("compare", help="B against A, job by job: ratio of medians, its interval, SAME/FASTER/SLOWER/UNSURE, or SUSPECT",
                       description="A and B select stored runs: latest and previous (each job's newest measurement, "
                                   "and the one before it), sweep:N, commit:SHA, a git revision (HEAD~1, HEAD, or "
                                   "rev:NAME), experiment:NAME, results:DIR (a sweep's results directory), runs:LO-HI, "
                                   "or the bare value; with none, previous and latest. Each matched job gets the ratio "
                                   "of B's median to A's over the stored samples, a 95% bootstrap interval and a "
                                   "verdict. Exit status 1 when a verdict fails --fail-on (SUSPECT never does).")
    p.add_argument("a", nargs="?", help="the baseline selection (default: previous)")
    p.add_argument("b", nargs="?", help="the selection compared with it (default: latest)")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--db-b", metavar="URL",
                   help="SQLAlchemy URL of the result store B is read from, when not --db's "
                        "(say, another machine's or session's SQLite file; default: --db)")
    p.add_argument("--metric", default="op_time",
                   help="op_time (the conv layers' op times added up, per pass), forward_ms (the whole pass), or "
                        "a conv layer's name for its op time alone (default: %(default)s)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="the change that counts: SLOWER/FASTER beyond it, SAME within it (default: %(default)s)")
    p.add_argument("--cpu", action="store_true",
                   help="also compare the jobs timed on the CPU (the `reference` variant, numpy float32): left out "
                        "by default, since a shared host moves their times by tens of percent between runs")
    p.add_argument("--format", choices=("table", "json"), default="table", help="(default: %(default)s)")
    p.add_argument("--fail-on", choices=("slower", "unsure", "never"), default="slower",
                   help="the gate: exit 1 on SLOWER, on SLOWER or UNSURE, or never (default: %(default)s)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("watch",
                       help="on each save of a kernel or the sweep file: snakemake, then compare the jobs it re-ran",
                       description="Watches kernels/ (.cu, .cuh, variants.yaml) and the sweep file; on each save runs "
                                   "Snakemake as `snakemake` would, a line per finished job, then `compare previous "
                                   "latest` over the jobs it measured (never a gate), until Ctrl-C.")
    p.add_argument("--configfile", metavar="FILE", help="the sweep file, as snakemake's (default: experiments.yaml)")
    p.add_argument("--experiment", help="run and compare this experiment of the sweep file alone")
    p.add_argument("--cores", type=positive_int, help="snakemake --cores (default: the profile's)")
    p.add_argument("--cpu", action="store_true", help="also compare the jobs timed on the CPU, as compare --cpu")
    p.add_argument("--threshold", type=float, default=0.05, help="as compare's (default: %(default)s)")
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("report", help="write an experiment's tables, seeds-format report and figures",
                       description="Writes, for one experiment, any of: its runs as one Markdown table (--out, "
                                   "summary.md); the seeds-format report (--markdown report.md, --html for the same "
                                   "as one self-contained page): per variant the seeds' table, the speedup over the "
                                   "previous variant and over naive, what Nsight Compute says bounds each conv "
                                   "kernel, and the figures; the seeds' and why tables as CSV (--tables DIR); and, "
                                   "with --draw, its figures first.")
    p.add_argument("--experiment", required=True, help="the experiment of experiments.yaml to report")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--out", help="write the runs as one Markdown table to this file (summary.md)")
    p.add_argument("--markdown", metavar="FILE", help="write the seeds-format report as Markdown (report.md); "
                                                      "figures are linked relative to it")
    p.add_argument("--html", metavar="FILE", help="write the same report as one HTML page, figures embedded")
    p.add_argument("--tables", metavar="DIR", help="write seeds.csv and why.csv (the Nsight Compute evidence) to DIR")
    p.add_argument("--figures", metavar="DIR",
                   help="the experiment's figures (default: results/<experiment>/figures, where `convsweep plot` "
                        "draws them)")
    p.add_argument("--draw", action="store_true",
                   help="draw every figure the database has data for into --figures first (`convsweep plot all`); "
                        "a kind without data is skipped with the reason, none drawn is no error")
    p.add_argument("--bench", metavar="FILE",
                   help="with --draw: a `convsweep bench --json` file, whose copy bandwidth and matmul rates are the "
                        "roofline's ceilings")
    p.add_argument("--allow-empty", action="store_true",
                   help="an experiment with no run stored gets a report saying so instead of an error (the end of a "
                        "sweep none of whose jobs finished writes one, so `snakemake --report` finds its files)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("browse", help="open the result database in Datasette, read-only, with the named queries",
                       description="Serves the SQLite result database in Datasette (pip install -e '.[browse]'), "
                                   "read-only, with every db/queries/*.sql as a canned query titled by the question "
                                   "it answers, until Ctrl-C. Datasette serves SQLite files only. It serves only a "
                                   "browser that opened the URL browse prints, whose token is new each run (other "
                                   "users of this machine cannot read the database through it).")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--port", type=positive_int, default=8001, help="the port to listen on (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: %(default)s, this machine only)")
    p.set_defaults(func=cmd_browse)

    p = sub.add_parser("plot", help="draw figures from the database as PNG files",
                       description="Draws from the stored measurements, one PNG per kind: "
                                   + " ".join(f"{kind}: {FIGURES[kind].description}" for kind in PLOT_KINDS)
                                   + " Prints the files written, and the figures skipped for want of data with the "
                                   "reason.")
    p.add_argument("kind", choices=(*PLOT_KINDS, "all"), metavar="KIND",
                   help=f"one of {', '.join(PLOT_KINDS)}, or all")
    p.add_argument("--experiment", help="plot this experiment (default: each stored one)")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--out", metavar="DIR",
                   help="the folder for the PNG files (default: results/<experiment>/figures, or results/figures "
                        "without --experiment, where files are named <experiment>-<kind>.png)")
    p.add_argument("--bench", metavar="FILE",
                   help="a `convsweep bench --json` file: its device copy bandwidth and matmul rates are the "
                        "roofline's ceilings (without it the roofline has none)")
    p.set_defaults(func=cmd_plot)
    replay.add_parser(sub, DB_HELP)  # the commands whose parsers live beside them
    kerneltuner.add_parsers(sub, DB_HELP)
    confirm.add_parser(sub)
    return parser


def os_error_line(e: OSError) -> str:
    """An OSError in the CLI's words: what went wrong and on which file, e.g. `No space left on device
    (results/e/runs/x.json)`."""
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return (e.strerror or str(e)) + (f" ({where})" if where else "")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail on it a second
    time (the recipe of Python's signal documentation for a closed pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from .paths import check_same_checkout, require_checkout

        require_checkout()
        if args.checkout:
            check_same_checkout(args.checkout)
        args.func(args)
        try:  # inside the handlers: a full disk or a closed pipe on stdout shows here, not at exit
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            e.filename = e.filename or "standard output"  # a failed write names no file
            raise
    except ConvsweepError as e:
        if args.verbose:
            raise
        print(f"convsweep: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`convsweep query summary | head`): stop quietly, as `cat` does, with the
        # status a shell gives a process that SIGPIPE ended (128 + 13).
        _quiet_stdout()
        return 141
    except OSError as e:
        if args.verbose:
            raise
        try:
            sys.stdout.flush()
        except OSError:  # stdout cannot take what it holds either: drop it, not fail again at exit
            _quiet_stdout()
        print(f"convsweep: {os_error_line(e)}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    """The `convsweep` program: main(), then exit without the interpreter's last garbage collection
    over everything the command made (a tenth of a second of a job's or a report's end, during which
    a sweep's next step waits)."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    run()
