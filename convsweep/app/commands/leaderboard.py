"""`convsweep leaderboard`: a course's submissions ranked per GPU model and batch, in statistical tiers, with points."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from .common import add_db, add_experiment, add_format


def add_parser(sub) -> None:
    p = sub.add_parser("leaderboard", help="rank a course's submissions per GPU and batch, in tiers the samples can "
                                           "tell apart, with points",
                       description="A submission is a student's variants, named SUBMISSION__VARIANT (a name without "
                                   "__ is its own submission). Per experiment, GPU model and cell (the batch and the "
                                   "other axes) each submission stands by its best trusted run (ok, every check "
                                   "passed, checks: full), ranked by its median op-time sum; those the stored samples "
                                   "cannot tell apart share a tier and a rank (docs/leaderboard.md). Every run not "
                                   "ranked (failed, incorrect, suspect, timed out, not fresh, fast-checked) is listed "
                                   "below with its reason and its builds' findings.")
    add_db(p)
    add_experiment(p, "the experiment to rank (default: every experiment, each on boards of its own)")
    add_format(p)
    p.add_argument("--points", metavar="FILE",
                   help="a thresholds file (workflow/schemas/leaderboard.schema.yaml), e.g. `points: "
                        "[{op_time_sum_ms_at_most: 80, batch: 10000, points: 100}]`: each submission's points")
    # convsweep.analysis.leaderboard.DEFAULT_THRESHOLD (a test ties them), written out so that building the parser
    # does not import the database layer for every command.
    p.add_argument("--threshold", type=float, default=0.05,
                   help="a new tier starts where the 95%% interval of a median over its tier leader's lies wholly "
                        "above 1 + this (default: %(default)s)")
    p.add_argument("--fast-checks", action="store_true",
                   help="rank runs measured with `checks: fast` too (no caching test vouches for them; marked); "
                        "by default they are listed as not ranked")
    p.add_argument("--html", metavar="FILE", help="also write the leaderboard as one standalone HTML page")
    p.add_argument("--reports", metavar="DIR",
                   help="also write each submission's milestone report into DIR, one standalone page each "
                        "(<submission>.html): its results per GPU and batch, speedup, Nsight Compute, nsys, history")
    p.add_argument("--baseline", default="naive", metavar="NAME",
                   help="the submission the reports' speedups are over, where it ranked beside them (default: "
                        "%(default)s, the shipped baseline run in the class's sweep)")
    p.add_argument("--confirm", type=int, metavar="ROUNDS",
                   help="first measure each tier's top again, ROUNDS turns each (at least 6; 8 to 10 tell smaller gaps), every turn a process of "
                        "its own on fresh inputs, the tops alternating (A B C, C B A, ...), and hold each to the next "
                        "tier's top by a paired test: boards of this machine's GPU model only (docs/leaderboard.md)")
    p.add_argument("--confirm-repeats", type=int, default=5, metavar="N",
                   help="timed passes per turn (default: %(default)s)")
    p.add_argument("--confirm-dir", metavar="DIR",
                   help="keep each turn's spec, result file and log in DIR (default: a temporary folder)")
    p.set_defaults(func=run)


def turn_runner(db: str | None, folder: Path, repeats: int, verbose: bool = False):
    """measure(board, entry) for convsweep.analysis.tiers.confirm_boards: the entry's stored setting (its run's result
    file) measured once more by `convsweep run-job` in a process of its own, `repeats` timed passes, watched against
    the setting's deadline; returns (op-time sum of its layers' medians, None) or (None, why there is none)."""
    import functools
    import itertools
    import subprocess

    from convsweep.analysis.query import fetch_dicts
    from convsweep.base.strict_json import read_json
    from convsweep.measure.record import ResultFile
    from convsweep.sweep.config import JobSpec, RunSpec

    turns = itertools.count(1)

    @functools.cache
    def job_of(run_id: int) -> tuple[JobSpec | None, str | None]:
        """The run's stored setting as a lone job of `repeats` passes with every check, read once for all its turns."""
        _, rows = fetch_dicts(db, "SELECT measurement_id, result_path FROM run WHERE id = :id", {"id": run_id})
        if not rows or not rows[0]["result_path"] or not Path(rows[0]["result_path"]).is_file():
            return None, f"run {run_id}'s result file is not on this machine"
        stored = ResultFile.from_json(read_json(rows[0]["result_path"]))
        found = next((m for m in stored.measurements if m.measurement_id == rows[0]["measurement_id"]), None)
        if found is None:
            return None, f"run {run_id} is not in {rows[0]['result_path']}"
        return JobSpec.for_run(RunSpec(**{**found.spec, "repeats": repeats, "checks": "full"}), sweep=stored.sweep), None

    def measure(board, entry):
        job, why = job_of(entry.run_id)
        if job is None:
            return None, why
        n = next(turns)
        spec, out, log = (folder / f"turn-{n:03d}-{entry.submission}{ext}" for ext in (".json", ".result.json", ".log"))
        spec.write_text(json.dumps({**job.to_dict(), "sweep": job.sweep, "job_id": job.job_id}))
        command = [sys.executable, "-m", "convsweep", *(["-v"] if verbose else []), "run-job", "--spec-file", str(spec),
                   "--out", str(out)]
        with open(log, "w") as f:
            subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False)
        if not out.is_file():
            lines = log.read_text().strip().splitlines()
            return None, f"no result ({lines[-1] if lines else 'run-job said nothing'})"
        (m,) = ResultFile.from_json(read_json(out)).measurements
        if m.status != "ok" or m.timings is None or not m.timings.op_time_ms:
            return None, f"{m.status}: {m.error or 'no op time'}"
        total = sum(v or 0.0 for v in m.timings.op_time_ms.values())
        print(f"leaderboard: {board.title}: {entry.submission}, turn {n}: {total:.4f} ms", file=sys.stderr, flush=True)
        return total, None

    return measure


def run(args) -> None:
    from convsweep.analysis.leaderboard import leaderboard, load_points, render, write_html

    points = load_points(args.points) if args.points else None
    boards = leaderboard(args.db, args.experiment, threshold=args.threshold, fast_checks=args.fast_checks,
                         points=points)
    if args.confirm is not None:
        confirm(args, boards)
    print(render(boards, args.format, args.threshold), end="" if args.format == "csv" else "\n")
    if args.html:
        write_html(args.html, boards, args.threshold, args.experiment)
        print(f"leaderboard: wrote {args.html}", file=sys.stderr)
    if args.reports:
        from convsweep.analysis.milestone import write_reports

        written = write_reports(args.db, boards, args.reports, args.baseline)
        print(f"leaderboard: wrote {len(written)} milestone reports into {args.reports}", file=sys.stderr)


def confirm(args, boards) -> None:
    """--confirm: each board's tier tops measured again on this machine (convsweep.analysis.tiers)."""
    from convsweep.analysis.tiers import confirm_boards
    from convsweep.base.errors import ConvsweepError
    from convsweep.device.gpu import count_devices
    from convsweep.device.provenance import probe_machine

    if args.confirm_repeats < 1:
        raise ConvsweepError(f"leaderboard: --confirm-repeats must be 1 or more, got {args.confirm_repeats}")
    names = probe_machine(count_devices).gpu_names
    with tempfile.TemporaryDirectory(prefix="convsweep-tiers-") as tmp:
        folder = Path(args.confirm_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        measure = turn_runner(args.db, folder, args.confirm_repeats, getattr(args, "verbose", False))
        for line in confirm_boards(boards, args.confirm, measure, names):
            print(f"leaderboard: {line}", file=sys.stderr)
