"""`convsweep submissions check DIR`: every submission of a course (docs/course.md) checked without a GPU, its
files, registry, expressions and path rules (convsweep.sweep.submissions), then each variant built with NVRTC."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .common import resolve_arch



def add_parser(sub) -> None:
    p = sub.add_parser("submissions", help="a course's submissions (docs/course.md)")
    inner = p.add_subparsers(dest="submissions_command", required=True, metavar="ACTION",
                             help="check: every submission under DIR, without a GPU")
    check = inner.add_parser("check", help="check every submission under DIR: files, registry, path rules, NVRTC builds",
                             description="One line per submission (ok, or the first reason it is not), then a count; "
                                         "exit status 1 when any is not ok. No GPU is needed.")
    check.add_argument("dir", metavar="DIR", help="the folder of submissions (submissions/<id>/), or one submission")
    check.add_argument("--arch", default="sm_90a", help="the NVRTC target every variant is built for (default: "
                                                        "%(default)s; auto: this machine's GPU's own)")
    check.add_argument("--network", default="networks/lenet86.yaml",
                       help="the network whose conv layers the expressions are evaluated at (default: %(default)s)")
    check.add_argument("--format", choices=("text", "json"), default="text",
                       help="lines, or one JSON document (default: %(default)s)")
    check.set_defaults(func=run)


@dataclass
class Outcome:
    id: str
    reason: str | None = None  # None: ok
    variants: list[str] = field(default_factory=list)  # class-wide names
    builds: int = 0


def run(args) -> None:
    from convsweep.base.errors import CompileError, ConvsweepError
    from convsweep.base.paths import cache_dir, resolve_network_path
    from convsweep.device.compile import BuildRequest, compile_all
    from convsweep.model.network import load_network
    from convsweep.sweep.submissions import build_folder, check_builds, find_submissions, read_submission

    arch = resolve_arch(args.arch)
    network = load_network(resolve_network_path(args.network, Path.cwd()))
    found = find_submissions(Path(args.dir))
    if not found:
        raise ConvsweepError(f"{args.dir}: holds no submission folder (docs/course.md)")
    single = len(found) == 1 and found[0].path == Path(args.dir)
    outcomes = [Outcome(item.id, item.refusal) for item in found]
    requests: dict[BuildRequest, tuple] = {}
    for item, outcome in zip(found, outcomes):
        if item.refusal:
            continue
        shown = str(Path(args.dir) if single else Path(args.dir) / item.id)
        try:
            submission = read_submission(item.path, item.id, shown, network)
            folder = build_folder(submission, cache_dir() / "submissions")
            mine = {}
            for name, var in submission.variants.items():
                var.build_arch(arch)  # a target its registry arch rules out: one line, before NVRTC
                for macros in check_builds(var, network):
                    source = folder / Path(str(var.source)).name
                    mine[BuildRequest.of(source, submission.class_name(name), macros)] = (outcome, var, folder, shown)
        except Exception as e:  # a bad submission never stops the others; a bug in the check is told too
            outcome.reason = _reason(e)
            continue
        outcome.variants = list(submission.class_variants())
        requests.update(mine)
    with compile_all(list(requests), arch) as pending:
        results = pending.wait()
    for request, (outcome, var, folder, shown) in requests.items():
        result = results[request]
        if outcome.reason:
            continue
        if isinstance(result, CompileError):
            outcome.reason = _from_folder(str(result), folder, shown)
            continue
        outcome.builds += 1
        defined = {kernel.name for kernel in result.kernels}
        if missing := [kernel for kernel in var.kernel_names if kernel not in defined]:
            outcome.reason = (f"{shown}/{Path(str(var.source)).name}: defines no extern \"C\" __global__ function "
                              f"'{missing[0]}', which the registry's launches of '{var.name}' name (it defines: "
                              f"{', '.join(sorted(defined)) or 'none'})")
    _report(sorted(outcomes, key=lambda o: o.id), arch, args.format)
    if any(outcome.reason for outcome in outcomes):
        raise SystemExit(1)


def _reason(e: Exception) -> str:
    from convsweep.base.errors import failure_message

    if isinstance(e, OSError):
        return f"{e.filename}: {e.strerror or e}" if e.filename else str(e)
    return failure_message(e)


def _from_folder(message: str, folder: Path, shown: str) -> str:
    """A compiler's line about the build folder, naming the submission's files instead, and the shipped headers
    (copied beside them) as kernels/."""
    from convsweep.base.paths import relative_to_root
    from convsweep.sweep.submissions import shipped_headers

    for named in dict.fromkeys((str(folder.resolve()), relative_to_root(folder), str(folder))):
        for header in shipped_headers():
            message = message.replace(f"{named}/{header}", f"kernels/{header}")
        message = message.replace(named, shown)
    return message


def _report(outcomes: list[Outcome], arch: str, fmt: str) -> None:
    from convsweep.sweep.submissions import one_line  # here: every command's start stays light

    ok = sum(1 for outcome in outcomes if not outcome.reason)
    if fmt == "json":
        print(json.dumps({"arch": arch, "ok": ok, "not_ok": len(outcomes) - ok, "submissions": [
            {"id": o.id, "ok": not o.reason, "reason": o.reason and one_line(o.reason), "variants": o.variants,
             "builds": o.builds} for o in outcomes]}, indent=1))
        return
    for o in outcomes:
        if o.reason:
            print(f"{o.id}: {one_line(o.reason)}")
        else:
            print(f"{o.id}: ok: {len(o.variants)} variant{'s' * (len(o.variants) != 1)} ({', '.join(o.variants)}), "
                  f"{o.builds} build{'s' * (o.builds != 1)} for {arch}")
    print(f"{len(outcomes)} submission{'s' * (len(outcomes) != 1)}: {ok} ok, {len(outcomes) - ok} not")
    sys.stdout.flush()
