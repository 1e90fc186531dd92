"""`convsweep`: the command line the Snakemake rules (and people) call.

Every error a user can cause prints one line, `convsweep: <what>`, and exits 2; a traceback
only with --verbose.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .errors import ConvsweepError


def process_age() -> float | None:
    """Seconds since this process started, or None where that is unknown.

    On Linux both ends are on the boot clock: the start in clock ticks since boot (/proc/self/stat
    field 22) against /proc/uptime. psutil's create_time() adds a boot time truncated to whole
    seconds and is compared with time.time(), which put total_s up to a second too high.
    """
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22; `comm` may hold ' ' and ')'
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:
        return None


def _parse_params(items: list[str]) -> dict:
    params = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConvsweepError(f"--param {item}: expected NAME=VALUE")
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def resolve_arch(arch: str) -> str:
    """'auto' is the GPU's own architecture, or sm_90 (the lent H100) where there is no GPU."""
    if arch != "auto":
        return arch
    from .gpu import Gpu, gpu_available

    ok, _ = gpu_available()
    if not ok:
        return "sm_90"
    with Gpu() as gpu:
        return gpu.arch


def cmd_jobs(args) -> None:
    from .config import expand_config, load_config

    for job in expand_config(load_config(args.config)):
        print(json.dumps({**job.to_dict(), "job_id": job.job_id}) if args.json else f"{job.experiment}\t{job.job_id}")


def _spec_from_args(args):
    from .config import JobSpec

    text = Path(args.spec_file).read_text() if args.spec_file else args.spec
    try:
        return JobSpec.from_dict(json.loads(text))
    except (json.JSONDecodeError, TypeError) as e:
        raise ConvsweepError(f"--spec: not a job spec ({e})") from None


def cmd_run_job(args) -> None:
    from .job import run_job

    result = run_job(_spec_from_args(args), Path(args.out), process_age=process_age())
    t = result["timings"]
    ops = ", ".join(f"{k} {v:.3f} ms" for k, v in t["op_time_ms"].items() if v is not None)
    print(f"{result['job_id']}: {result['status']} ({result['profiler']}) {ops}"
          + (f" accuracy {result['accuracy']:.4f}" if result["accuracy"] is not None else "")
          + (f" - {result['error']}" if result["error"] else ""))


def cmd_measure(args) -> None:
    from .job import measure_to_file

    measure_to_file(_spec_from_args(args), Path(args.out))


def cmd_compile(args) -> None:
    from tabulate import tabulate

    from .compile import compile_source
    from .job import write_json_atomic
    from .variants import get_variant, load_registry

    arch = resolve_arch(args.arch)
    names = sorted(v for v, var in load_registry().items() if not var.is_cpu) if args.variant == "all" else [args.variant]
    rows, records = [], []
    for name in names:
        var = get_variant(name)
        if var.is_cpu:
            raise ConvsweepError(f"variant '{name}' runs on the CPU: nothing to compile")
        combos = var.all_combinations() if args.all_params else [var.resolve_params(_parse_params(args.param), "--param")]
        fixed = _parse_params(args.define)
        missing = [f"{n}_FIXED" for n in var.compile_time if f"{n}_FIXED" not in fixed]
        if missing:
            raise ConvsweepError(f"variant '{name}' fixes the layer shape at compile time: give --define {'=... --define '.join(missing)}=...")
        for params in combos:
            build = compile_source(var.source, name, {**params, **fixed}, arch)
            records.append(build.record())
            for k in build.kernels:
                rows.append([name, json.dumps(params, sort_keys=True), arch, k.name, k.registers, k.shared_bytes,
                             k.local_bytes, k.spill_store_bytes, f"{build.compile_ms:.0f}", "hit" if build.cache_hit else "miss"])
    if args.out:
        write_json_atomic(Path(args.out), {"arch": arch, "builds": records})
    print(tabulate(rows, headers=["variant", "params", "arch", "kernel", "regs", "smem B", "local B", "spill B", "ms", "cache"],
                   tablefmt="github"))


def cmd_ingest(args) -> None:
    from .job import write_json_atomic
    from .store import ingest_files, open_store

    engine = open_store(args.db)
    t = time.perf_counter()
    report = ingest_files(engine, [Path(p) for p in args.results])
    summary = {"added": report.added, "unchanged": report.unchanged, "files": len(args.results),
               "seconds": round(time.perf_counter() - t, 3)}
    print(f"ingested {summary['files']} results: {report.added} added, {report.unchanged} already stored")
    if args.report:
        write_json_atomic(Path(args.report), summary)


def cmd_query(args) -> None:
    from .query import list_queries, run_query

    if args.list or not args.query:
        for name, description in list_queries():
            print(f"{name:12s} {description}")
        return
    params = dict(p.split("=", 1) for p in args.param or [])
    print(run_query(args.db, args.query, fmt=args.format, params=params or None))


def cmd_report(args) -> None:
    from .query import run_query

    sql = ("SELECT variant, batch, streams, host_memory, status, op_time_1_ms, op_time_2_ms, forward_ms, total_s, accuracy"
           " FROM run_summary WHERE experiment = :experiment ORDER BY variant, batch, streams, host_memory")
    table = run_query(args.db, sql, fmt="table", params={"experiment": args.experiment})
    text = f"# {args.experiment}\n\n{table}\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(text)


def cmd_bench(args) -> None:
    from .bench import format_report, load_bench_config, run_bench
    from .job import write_json_atomic

    config = load_bench_config(args.config)
    profilers = ("events", "nsys") if args.harness else ()
    result = run_bench(config, batch=args.batch, repeats=args.repeats, harness=args.harness, harness_profilers=profilers,
                       log=lambda message: print(f"bench: {message}", file=sys.stderr, flush=True))
    if args.json:
        write_json_atomic(Path(args.json), result)
    print(format_report(result))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convsweep", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("jobs", help="list the jobs of a sweep")
    p.add_argument("--config", default="experiments.yaml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    for name, func, helptext in (("run-job", cmd_run_job, "run one job and write its result JSON"),
                                 ("measure", cmd_measure, argparse.SUPPRESS)):
        p = sub.add_parser(name, help=helptext)
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--spec", help="the job spec as JSON")
        src.add_argument("--spec-file")
        p.add_argument("--out", required=True)
        p.set_defaults(func=func)

    p = sub.add_parser("compile", help="compile a variant with NVRTC and show its resource usage")
    p.add_argument("variant", help="a variant name, or 'all'")
    p.add_argument("--param", action="append", metavar="NAME=VALUE")
    p.add_argument("--all-params", action="store_true", help="every combination in the registry")
    p.add_argument("--define", action="append", metavar="NAME=VALUE",
                   help="a shape macro for variants compiled per layer shape (e.g. K_FIXED=7)")
    p.add_argument("--arch", default="auto")
    p.add_argument("--out")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("ingest", help="store result JSONs in the database (idempotent)")
    p.add_argument("results", nargs="*")
    p.add_argument("--db", help="SQLAlchemy URL (default: $CONVSWEEP_DB or sqlite:///db/results.sqlite)")
    p.add_argument("--report")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("query", help="run SQL or a named query (db/queries/NAME.sql) read-only")
    p.add_argument("query", nargs="?", help="a query name or SQL text")
    p.add_argument("--db")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="bind :NAME in the SQL")
    p.add_argument("--list", action="store_true", help="list the named queries")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("bench", help="time the best variants beside cuDNN, the memory floor and the targets",
                       description="Times every candidate of the bench file per conv layer (checked against float64), "
                                   "the whole forward and the end-to-end pipeline with the best ones, and cuDNN on the "
                                   "same shapes when PyTorch is installed; prints ms, GB/s, GFLOP/s, the memory floor, "
                                   "ratios and the targets of the file.")
    p.add_argument("--config", default="bench/default.yaml", help="the bench file (default: %(default)s)")
    p.add_argument("--batch", type=_positive_int, help="images per batch (default: the file's, 10000)")
    p.add_argument("--repeats", type=_positive_int, help="timed runs per measurement (default: the file's, 20)")
    p.add_argument("--json", metavar="FILE", help="write every number (samples included) to FILE")
    p.add_argument("--harness", action="store_true",
                   help="also run a LeNet job twice with events and twice under nsys (if found) and judge the cached runs' total_s")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="write an experiment's table as Markdown")
    p.add_argument("--experiment", required=True)
    p.add_argument("--db")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ConvsweepError as e:
        if args.verbose:
            raise
        print(f"convsweep: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
