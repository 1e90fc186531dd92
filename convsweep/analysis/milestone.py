"""Each submission's milestone report: one standalone HTML page a student can open, from what the store holds.

What a course's milestone report asks for (the seeds' project: op time of each conv layer, total time and
accuracy at each batch, with nsys and Nsight Compute screenshots), as tables: per GPU model and batch its standing
on the leaderboard (rank and tier, or why it is not ranked), the op times, their sum, the forward pass and the
accuracy, and the speedup over the course's baseline where the baseline ran beside it; what Nsight Compute says
bounds each of its kernels (the newest profile of that setting, `ncu:` in the experiment); the nsys timeline summary
of its measured run (each kernel's launches and time, each copy's bytes and time); and its history, every
measurement stored of it, oldest first, with the source each was built from. Made by `convsweep leaderboard
--reports DIR` from the same boards as the leaderboard (convsweep.analysis.leaderboard).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convsweep.base import axes
from convsweep.base.document import Heading, Paragraph, Table, to_html
from convsweep.base.fileio import json_column, write_atomic
from convsweep.base.numbers import fixed, short, times
from .leaderboard import Board, Entry, run_submission
from .query import fetch_dicts

_FILE_NAME = re.compile(r"[^A-Za-z0-9_.+-]")

_KERNELS_SQL = """
SELECT layer, name, launches, total_ms, median_ms, grid, block, registers
FROM kernel WHERE run_id = :run_id ORDER BY layer, name"""
_COPIES_SQL = "SELECT kind, count, bytes, total_ms FROM memcpy WHERE run_id = :run_id ORDER BY kind"
_PROFILE_SQL = """
SELECT kp.profile_id, kp.layer, kp.kernel, kp.launch, kp.duration_ms, kp.sm_pct, kp.memory_pct, kp.dram_pct,
       kp.achieved_occupancy_pct, kp.occupancy_limiter, kp.bound, kp.profiled_at
FROM kernel_profile kp
JOIN run r ON r.run_key = kp.run_key
WHERE r.id = :run_id AND (kp.gpu IS NULL OR kp.gpu = :gpu)
ORDER BY kp.profiled_at DESC, kp.layer, kp.kernel, kp.launch"""
_HISTORY_SQL = """
SELECT r.id AS run_id, r.started_at, r.batch, r.variant, r.variants, r.status, r.source_hash, r.accuracy,
       o.op_time_1_ms, o.op_time_2_ms, e.gpu
FROM run r
JOIN environment e ON e.id = r.environment_id
LEFT JOIN run_op_time o ON o.run_id = r.id
WHERE r.experiment = :experiment AND (r.profiler IS NULL OR r.profiler <> 'cpu')
ORDER BY r.started_at, r.id"""


def file_name(submission: str) -> str:
    """The page's file name: the submission's name, anything but letters, digits and ._+- made _."""
    return _FILE_NAME.sub("_", submission) + ".html"


def write_reports(db: str | None, boards: Sequence[Board], folder: str | Path, baseline: str | None = "naive"
                  ) -> list[Path]:
    """One page per submission on `boards` into `folder` (made), each written whole; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    histories = measurements(db, {board.experiment for board in boards})  # read once for every page
    for submission in sorted({entry.submission for board in boards for entry in board.standing()}):
        title = f"Milestone report: {submission}"
        path = folder / file_name(submission)
        blocks = report(db, boards, submission, baseline, histories)
        write_atomic(path, to_html([Heading(1, title), *blocks], title))
        written.append(path)
    return written


def measurements(db: str | None, experiments: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Every GPU measurement stored of each experiment, oldest first, each with its submission: the histories."""
    found = {}
    for experiment in experiments:
        _, rows = fetch_dicts(db, _HISTORY_SQL, {"experiment": experiment})
        for row in rows:
            row["submission"] = run_submission(json_column(row["variants"]), row["variant"])
        found[experiment] = rows
    return found


def report(db: str | None, boards: Sequence[Board], submission: str, baseline: str | None = "naive",
           histories: dict[str, list[dict[str, Any]]] | None = None) -> list:
    """`submission`'s page as document blocks (convsweep.base.document); `histories`: measurements(), where the
    caller read them already."""
    standing = [(board, entry) for board in boards for entry in board.standing() if entry.submission == submission]
    experiments = sorted({board.experiment for board, _ in standing})
    found: list = [Paragraph(f"Experiment {', '.join(experiments)}. Ranked among the class per GPU model and batch "
                             "by the median op-time sum of its best run that passed every check; `convsweep "
                             "leaderboard` has the whole board and docs/leaderboard.md how tiers are drawn.")]
    found += _results(standing, baseline)
    for board, entry in standing:
        found.append(Heading(2, f"{board.gpu} · {axes.cell_text(board.cell)}: {entry.variant} (run {entry.run_id})"))
        found += _profile(db, entry, board.gpu) + _timeline(db, entry)
    histories = histories if histories is not None else measurements(db, set(experiments))
    for experiment in experiments:
        found += _history(experiment, [row for row in histories.get(experiment, []) if row["submission"] == submission])
    return found


def _results(standing: list[tuple[Board, Entry]], baseline: str | None) -> list:
    rows = []
    for board, entry in standing:
        base = next((e for e in board.ranked if e.submission == baseline), None) if baseline else None
        speedup = (times(base.op_time_sum_ms / entry.op_time_sum_ms)
                   if base is not None and base.op_time_sum_ms and entry.op_time_sum_ms and entry.rank else "")
        place = (f"rank {entry.rank}, tier {entry.tier}" if entry.rank else
                 f"not ranked: {entry.status}" + (f" ({entry.reason})" if entry.reason else ""))
        rows.append([board.gpu, str(board.cell["batch"]), axes.cell_text(board.cell), entry.variant, place,
                     _ms(entry.op_time_1_ms), _ms(entry.op_time_2_ms), _ms(entry.op_time_sum_ms),
                     _ms(entry.forward_ms), fixed(entry.accuracy, 4), speedup])
    baseline_note = (f" Speedup: the baseline's (`{baseline}`, ranked beside it) op-time sum over this one's." if
                     baseline else "")
    return [Heading(2, "Results"),
            Paragraph("Op Time 1 and 2 are the conv layers' times, medians of the timed passes; the forward pass is "
                      "the whole network's (copies in and out included); accuracy is over the seeds' batch." +
                      baseline_note),
            Table(["GPU", "batch", "cell", "variant", "standing", "Op Time 1 (ms)", "Op Time 2 (ms)",
                   "op time sum (ms)", "forward (ms)", "accuracy", "speedup"], rows,
                  [False, True, False, False, False, True, True, True, True, True, True])]


def _profile(db: str | None, entry: Entry, gpu: str) -> list:
    _, rows = fetch_dicts(db, _PROFILE_SQL, {"run_id": entry.run_id, "gpu": gpu})
    if not rows:
        return [Paragraph("Nsight Compute: no profile of this setting is stored (`ncu: auto` in the experiment "
                          "profiles each GPU cell's kernels once, where ncu is installed).")]
    newest = [row for row in rows if row["profile_id"] == rows[0]["profile_id"]]
    return [Paragraph(f"Nsight Compute (profiled {_when(newest[0]['profiled_at'])}): what bounds each kernel."),
            Table(["layer", "kernel", "launch", "duration (ms)", "bound", "SM %", "memory %", "DRAM %",
                   "occupancy %", "occupancy limiter"],
                  [[str(r["layer"]), str(r["kernel"]), str(r["launch"]), _ms(r["duration_ms"]), str(r["bound"] or ""),
                    _pct(r["sm_pct"]), _pct(r["memory_pct"]), _pct(r["dram_pct"]), _pct(r["achieved_occupancy_pct"]),
                    str(r["occupancy_limiter"] or "")] for r in newest],
                  [False, False, True, True, False, True, True, True, True, False])]


def _timeline(db: str | None, entry: Entry) -> list:
    _, kernels = fetch_dicts(db, _KERNELS_SQL, {"run_id": entry.run_id})
    _, copies = fetch_dicts(db, _COPIES_SQL, {"run_id": entry.run_id})
    if not kernels and not copies:
        return [Paragraph("nsys: no timeline of this run is stored (it was timed with CUDA events alone).")]
    found: list = [Paragraph("nsys timeline summary of the run: its kernels and its copies over the timed passes.")]
    if kernels:
        found.append(Table(["layer", "kernel", "launches", "total (ms)", "median (ms)", "grid", "block", "registers"],
                           [[str(k["layer"]), str(k["name"]), str(k["launches"]), _ms(k["total_ms"]),
                             _ms(k["median_ms"]), _shape(k["grid"]), _shape(k["block"]), str(k["registers"] or "")]
                            for k in kernels], [False, False, True, True, True, False, False, True]))
    if copies:
        found.append(Table(["copy", "count", "bytes", "total (ms)"],
                           [[str(c["kind"]), str(c["count"]), str(c["bytes"]), _ms(c["total_ms"])] for c in copies],
                           [False, True, True, True]))
    return found


def _history(experiment: str, mine: list[dict[str, Any]]) -> list:
    return [Heading(2, f"History in {experiment}"),
            Paragraph(f"Every measurement stored of it, oldest first ({len(mine)}): a resubmission shows as a new "
                      "source."),
            Table(["measured", "GPU", "batch", "variant", "status", "source", "Op Time 1 (ms)", "Op Time 2 (ms)",
                   "accuracy"],
                  [[_when(r["started_at"]), str(r["gpu"]), str(r["batch"]), str(r["variant"]), str(r["status"]),
                    str(r["source_hash"] or "")[:12], _ms(r["op_time_1_ms"]), _ms(r["op_time_2_ms"]),
                    fixed(r["accuracy"], 4)] for r in mine],
                  [False, False, True, False, False, False, True, True, True])]


def _when(value: Any) -> str:
    """A stored time to the minute (SQLite hands back its text, PostgreSQL a datetime)."""
    return str(value)[:16]


def _ms(value: float | None) -> str:
    return "" if value is None else short(value)


def _pct(value: Any) -> str:
    return "" if value is None else f"{float(value):.1f}"


def _shape(value: Any) -> str:
    value = json_column(value) if isinstance(value, str) else value
    return "x".join(str(v) for v in value) if isinstance(value, list) else str(value or "")
