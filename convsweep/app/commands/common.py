"""What several commands share, declared once: the store (--db), an experiment (--experiment), an output
format (--format), a job spec (--spec or --spec-file), a watched command's worker (--worker), NAME=VALUE options and
the build target."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from convsweep.base.errors import ConvsweepError
from convsweep.base.paths import DEFAULT_DB_URL

DB_HELP = f"SQLAlchemy URL of the result store (default: $CONVSWEEP_DB or {DEFAULT_DB_URL})"
FORMAT_WORDS = {"table": "a Markdown table", "csv": "CSV", "json": "JSON rows"}


def add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=DB_HELP)


def add_experiment(p: argparse.ArgumentParser, what: str, *, required: bool = False, default: str | None = None) -> None:
    """--experiment, `what` saying what the command does with it."""
    p.add_argument("--experiment", required=required, default=default,
                   help=what + (" (default: %(default)s)" if default else ""))


def add_worker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worker", action="store_true", help="measure here, unwatched: what the watching process runs")


def worker_command(args, command: str, *own: str) -> list[str]:
    """`command` with its `own` arguments as its worker runs it (convsweep.measure.deadline watches it): the same
    checkout and verbosity, and --worker."""
    around = [*(["--checkout", args.checkout] if args.checkout else []), *(["-v"] if args.verbose else [])]
    return [sys.executable, "-m", "convsweep", *around, command, *own, "--worker"]


def add_format(p: argparse.ArgumentParser, choices: tuple[str, ...] = ("table", "csv", "json")) -> None:
    words = [FORMAT_WORDS[choice] for choice in choices]
    p.add_argument("--format", choices=choices, default=choices[0],
                   help=f"{', '.join(words[:-1])} or {words[-1]} (default: %(default)s)")


def add_spec_source(p: argparse.ArgumentParser) -> None:
    """--spec or --spec-file, one of them: the job a job command runs."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", help="the job spec as JSON: a line of `convsweep jobs --json`")
    src.add_argument("--spec-file", help="a file holding the job spec (a sweep writes one per job in "
                                         "<results>/<experiment>/specs/)")


def read_spec(args) -> dict:
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


def job_spec(data: dict):
    from convsweep.sweep.config import JobSpec

    try:
        job = JobSpec.from_dict({k: v for k, v in data.items() if k not in SPEC_EXTRAS})
    except TypeError as e:
        raise ConvsweepError(f"--spec: not a job spec ({e})") from None
    if data.get("job_id", job.job_id) != job.job_id:
        raise ConvsweepError(f"--spec: job_id {data['job_id']!r} is not its spec's ({job.job_id}): "
                             "was the spec edited?")
    return job


def parse_params(items: list[str], typed: bool = True) -> dict:
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
    from convsweep.device.gpu import Gpu, gpu_available
    from convsweep.device.provenance import NO_GPU_ARCH, host_gpu_arch

    if found := host_gpu_arch():
        return found

    ok, _ = gpu_available()
    if not ok:
        return NO_GPU_ARCH
    with Gpu() as gpu:
        return gpu.arch
