"""`convsweep report`: an experiment as the course reports were typed by hand, generated. First what its
sweep asked for and has no result of (report_coverage); then per variant: the seeds' table, the speedup over
the previous variant and over the naive baseline, and what Nsight Compute says bounds each conv kernel; then
which variants lie on each conv layer's front of op time against energy per pass, where energy was measured;
then the figures. Written as Markdown (report.md, figures
linked), as one self-contained HTML page (figures embedded: what the Snakemake report shows) and as
CSV tables.

The database is read through convsweep.query (read-only, SQLite or PostgreSQL alike), imported only
when a report is made: SQLAlchemy is slow to load.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import axes
from .config import tunables_text
from .document import Bullets, Figure, Heading, Paragraph, Table, to_html, to_markdown
from .errors import ConvsweepError
from .fileio import checked_directory, json_column, write_atomic
from .pareto import front_section
from .floors import times_floor
from .figures import FIGURES, KINDS, figure_files
from .report_coverage import Coverage, read_coverage, section as coverage_section
from .reading import (BASELINE_VARIANT, PROVENANCE_COLUMNS, fastest as fastest_rows, provenance,
                      whole_network)

# What tells two runs of one variant apart besides its tunables, the sweep's axes: (column, heading). A
# column other than batch is shown only where the experiment varies it.
CELL_COLUMNS = tuple((axis.name, axis.heading) for axis in axes.AXES)
NO_VALUE = "—"

RUNS_SQL = f"""
SELECT r.id AS run_id, r.job_id, r.variant, r.params, {axes.columns("r")},
       r.status, r.error, r.checks, r.findings, r.op_time_1_ms, r.op_time_1_spread, r.op_time_2_ms, r.op_time_2_spread,
       r.forward_ms, r.forward_spread, r.forward_floor_ms, r.total_s, r.accuracy, r.profiler,
       conv.op_time_ms, conv.timed_layers, conv.conv_layers, {PROVENANCE_COLUMNS}
FROM latest_run r
JOIN environment e ON e.id = r.environment_id
LEFT JOIN (SELECT run_id, SUM(op_time_ms) AS op_time_ms, COUNT(op_time_ms) AS timed_layers,
                  COUNT(*) AS conv_layers
           FROM layer_time GROUP BY run_id) conv ON conv.run_id = r.id
WHERE r.experiment = :experiment
ORDER BY r.variant, {axes.order_by("r")}, r.id"""

READING_GUIDE = [
    "**op time 1**, **op time 2**: the GPU time of the first and the second conv layer's kernels (nsys, else "
    "CUDA events), median over the timed passes: the seeds' \"Op Time\" lines.",
    "**forward**: one whole inference pass, from the first host-to-device copy to the last device-to-host copy.",
    "**total**: the job's wall time, process start to result written (a tuning job's settings share it): "
    "the seeds' \"Total Execution Time\".",
    "**accuracy**: top-1 against the labels: the seeds' \"Correctness\".",
    "**±%**: how noisy the median beside it is: its samples' median absolute deviation in % of the median.",
    "**× floor**: the forward over its floor at this GPU's measured rates (`convsweep bench --ceilings-only --db`): "
    "the input in its format up over the bus, the compute, the logits down, pipelined over the chunks; 1.2 is "
    "within 20% of what this machine allows.",
    "**speedup**: the other variant's op time (the conv layers' op times added up) over this one's, at the same "
    "batch, streams, host memory and L2 state, the fastest setting of each. **previous**: the variant before it "
    "here, where variants run from the slowest to the fastest (by their speedup over the baseline at the largest "
    f"batch they share). **baseline**: {BASELINE_VARIANT}.",
    "**suspect**: a run every check passed but whose times the integrity checks doubt (below the physical floor, "
    "faster on a round it had seen, device state left set, work outside the timer): under its variant with its "
    "reasons, never the fastest. **fast checks**: `checks: fast` (no caching test), marked `fast` where shown.",
]


@dataclass
class Experiment:
    """What the report of one experiment is made from: its runs (the latest measurement of each
    setting), its rows of the `why` query and its fronts of op time against energy (convsweep.pareto)."""

    name: str
    runs: list[dict[str, Any]]
    why_columns: list[str] = field(default_factory=list)
    why: list[dict[str, Any]] = field(default_factory=list)
    fronts: list = field(default_factory=list)
    winners: list[dict[str, Any]] = field(default_factory=list)  # the `winners` query's rows of this experiment
    coverage: Coverage | None = None  # what the sweep asked for and has no result of, where its records say


# -- reading -----------------------------------------------------------------------------------------
def _rows(url: str | None, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    from .query import fetch_dicts

    return fetch_dicts(url, sql, params)


class NoRuns(ConvsweepError):
    """The experiment has no run stored."""


def load(url: str | None, experiment: str) -> Experiment:
    """The experiment's runs, Nsight Compute rows and fronts; NoRuns when it has no run stored."""
    from .pareto import fronts

    _, runs = _rows(url, RUNS_SQL, {"experiment": experiment})
    if not runs:
        raise NoRuns(f"no runs of experiment {experiment!r} in the database: run its sweep first")
    for run in runs:
        run["params"] = json_column(run["params"]) or {}
        # An op time only where every conv layer has one: a partial sum would flatter the run.
        if not run["conv_layers"] or run["timed_layers"] != run["conv_layers"]:
            run["op_time_ms"] = None
    why_columns, why = _rows(url, "why")
    _, winners = _rows(url, "winners")
    return Experiment(experiment, runs, why_columns, [row for row in why if row["experiment"] == experiment],
                      fronts(url, experiment, intervals=False), [row for row in winners if row["experiment"] == experiment])


# -- speedups ----------------------------------------------------------------------------------------
def cell(run: dict[str, Any]) -> tuple:
    """The run's place in the matrix, its variant aside: its value of each axis."""
    return tuple(run[name] for name in axes.NAMES)


def _cell_order(key: tuple) -> tuple:
    """A cell's place in the tables (axes.sort_key: an automatic chunk size first)."""
    return axes.sort_key(dict(zip(axes.NAMES, key)))


def fastest(runs: Sequence[dict[str, Any]]) -> dict[str, dict[tuple, dict[str, Any]]]:
    """Per variant and cell (axes.CELL_COLUMNS within one experiment), the ok run with the least op time (a
    tuning grid's best setting)."""
    timed = [run for run in runs if run["status"] == "ok" and run["op_time_ms"]]
    best: dict[str, dict[tuple, dict[str, Any]]] = {}
    for run in fastest_rows(timed, ("variant", *axes.NAMES))[0].values():
        best.setdefault(run["variant"], {})[cell(run)] = run
    return best


def variant_order(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The baseline first, then from the slowest variant to the fastest by their speedup over it at
    the largest batch they share; variants sharing no cell with it last, by name."""
    best = fastest(runs)
    baseline = best.get(BASELINE_VARIANT, {})

    def rank(variant: str) -> tuple:
        if variant == BASELINE_VARIANT:
            return (0, 0.0, variant)
        shared = sorted(set(best.get(variant, {})) & set(baseline), key=_cell_order)
        if not shared:
            return (2, 0.0, variant)
        return (1, baseline[shared[-1]]["op_time_ms"] / best[variant][shared[-1]]["op_time_ms"], variant)

    return sorted({run["variant"] for run in runs}, key=rank)


def speedup(best: dict[str, dict[tuple, dict[str, Any]]], over: str | None, run: dict[str, Any]) -> float | None:
    """`over`'s op time in the run's cell (its fastest setting) over the run's, or None."""
    other = best.get(over or "", {}).get(cell(run))
    if other is None or not run["op_time_ms"]:
        return None
    return other["op_time_ms"] / run["op_time_ms"]


# -- building ----------------------------------------------------------------------------------------
def build(experiment: Experiment, figures: Sequence[Path] = (), figures_dir: Path | None = None) -> list:
    """The report's blocks: the reading guide, a section per variant, the figures."""
    runs = experiment.runs
    order = variant_order(runs)
    best = fastest(runs)
    shown = shown_columns(runs)
    statuses = sorted({run["status"] for run in runs})
    counts = ", ".join(f"{sum(run['status'] == s for run in runs)} {s}" for s in statuses)
    fast = sum(fast_checks(run) for run in runs)
    fast_text = f" {fast} of them measured with fast checks (no caching test)." if fast else ""
    blocks: list = [
        Heading(1, f"Report: {experiment.name}"),
        Paragraph(f"{provenance(runs)} {len(runs)} runs, the latest measurement of each setting: {counts}.{fast_text} "
                  "Generated by `convsweep report` from the result database; `convsweep query history` has every "
                  "measurement."),
        Bullets(READING_GUIDE),
    ]
    if BASELINE_VARIANT not in best:
        blocks.append(Paragraph(f"No ok `{BASELINE_VARIANT}` run in this experiment: no speedup over the baseline."))
    blocks += coverage_section(experiment.coverage, runs, "under its variant below")
    for index, variant in enumerate(order):
        previous = order[index - 1] if index > 0 else None
        blocks += _variant_section(experiment, variant, previous, best, shown)
    blocks += _winners_section(experiment)
    blocks += front_section(experiment.fronts)
    blocks += _figure_section(experiment.name, figures, figures_dir)
    return blocks


def _variant_section(experiment: Experiment, variant: str, previous: str | None,
                     best: dict[str, dict[tuple, dict[str, Any]]], shown: list[tuple[str, str]]) -> list:
    runs = [run for run in experiment.runs if run["variant"] == variant]
    ok = [run for run in runs if run["status"] == "ok"]
    grid = several_settings(runs)
    title = f"`{variant}`" + (" (the baseline)" if variant == BASELINE_VARIANT else "")
    blocks: list = [Heading(2, title)]
    if ok:
        blocks += [Heading(3, "The seeds' table"), _seeds_table(ok, shown, grid)]
    else:
        blocks.append(Paragraph("No ok run: nothing timed."))
    others = [run for run in runs if run["status"] != "ok"]
    if others:
        blocks += [Paragraph("Not in the table:"),
                   Bullets([f"{runs_text(group, shown, grid)}: {status}: {error[:300]}"
                            for (status, error), group in failure_groups(others).items()])]
    if findings := list(dict.fromkeys(run["findings"] for run in runs if run.get("findings"))):
        blocks += [Paragraph("What its kernels' PTX does that a convolution needs not (a fact, not a verdict):"),
                   Bullets(findings)]
    if variant != BASELINE_VARIANT and variant in best:
        blocks += [Heading(3, "Speedup"), *_speedups(variant, previous, best, shown, grid)]
    blocks += [Heading(3, "Nsight Compute: what bounds each conv kernel"), *_evidence(experiment, variant)]
    return blocks


def _seeds_table(runs: list[dict[str, Any]], shown: list[tuple[str, str]], grid: bool) -> Table:
    marked = any(fast_checks(run) for run in runs)  # the checks column only where a run was measured so
    floored = any(run.get("forward_floor_ms") for run in runs)  # × floor where the GPU's rates were measured
    headers = [heading for _, heading in shown] + (["tunables"] if grid else []) + [
        "op time 1 (ms)", "±%", "op time 2 (ms)", "±%", "forward (ms)", "±%"] + (["× floor"] if floored else []) + [
        "total (s)", "accuracy"] + (["checks"] if marked else [])
    rows = []
    for run in sorted(runs, key=lambda r: (_cell_order(cell(r)), r["op_time_ms"] or 0)):
        rows.append([_text(run[column]) for column, _ in shown] + ([tunables(run["params"])] if grid else []) + [
            _number(run["op_time_1_ms"]), _percent(run["op_time_1_spread"]),
            _number(run["op_time_2_ms"]), _percent(run["op_time_2_spread"]),
            _number(run["forward_ms"]), _percent(run["forward_spread"])]
            + ([_fixed(times_floor(run["forward_ms"], run.get("forward_floor_ms")), 2)] if floored else [])
            + [_number(run["total_s"]), _fixed(run["accuracy"], 4)] + ([_checks(run)] if marked else []))
    numeric = [axes.BY_NAME[column].numeric for column, _ in shown] + ([False] if grid else []) + [True] * (
        9 if floored else 8) + ([False] if marked else [])
    return Table(headers, rows, numeric)


def fast_checks(run: dict[str, Any]) -> bool:
    """Whether the run was measured with `checks: fast`: no caching test vouches for it."""
    return run.get("checks") == "fast"


def _checks(run: dict[str, Any]) -> str:
    return "fast" if fast_checks(run) else ""


def _speedups(variant: str, previous: str | None, best: dict[str, dict[tuple, dict[str, Any]]],
              shown: list[tuple[str, str]], grid: bool) -> list:
    """The table of the variant's speedups per cell, or why it has none."""
    compared = [(previous, f"× over {previous} (previous)")] if previous and previous != BASELINE_VARIANT else []
    if BASELINE_VARIANT in best:
        compared.append((BASELINE_VARIANT, f"× over {BASELINE_VARIANT} (baseline"
                                           + (", also the previous)" if previous == BASELINE_VARIANT else ")")))
    marked = any(fast_checks(run) for run in best[variant].values())
    headers = [heading for _, heading in shown] + (["fastest setting"] if grid else []) + ["op time (ms)"] + [
        heading for _, heading in compared] + (["checks"] if marked else [])
    rows = []
    for key in sorted(best[variant], key=_cell_order):
        run = best[variant][key]
        rows.append([_text(run[column]) for column, _ in shown] + ([tunables(run["params"])] if grid else [])
                    + [_number(run["op_time_ms"])] + [_times(speedup(best, over, run)) for over, _ in compared]
                    + ([_checks(run)] if marked else []))
    if not any(speedup(best, over, run) for run in best[variant].values() for over, _ in compared):
        others = " or ".join(f"`{over}`" for over, _ in compared)
        return [Paragraph(f"None: no {others} run at the batch, streams, host memory and L2 state of a `{variant}` "
                          "run." if others else "None: no other variant to compare with.")]
    numeric = [axes.BY_NAME[column].numeric for column, _ in shown] + ([False] if grid else []) + [True] * (
        1 + len(compared)) + ([False] if marked else [])
    return [Table(headers, rows, numeric)]


def several_settings(runs: Sequence[dict[str, Any]]) -> bool:
    """Whether runs (of one variant) were measured at more than one setting: a grid, whose rows need
    their tunables to tell them apart; one setting each does not."""
    return len({tunables(run["params"]) for run in runs}) > 1


def tunables(params: dict[str, dict]) -> str:
    """A run's tunables: 'BLOCK=64' when every layer has the same, else per layer as config says them."""
    values = list(params.values())
    if values and all(v == values[0] for v in values):
        return ",".join(f"{k}={v}" for k, v in values[0].items()) or "defaults"
    return tunables_text(params)


def shown_columns(runs: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """The CELL_COLUMNS that tell the runs apart: batch always, the others where they vary."""
    return [(column, heading) for column, heading in CELL_COLUMNS
            if column == "batch" or len({run[column] for run in runs}) > 1]


def failure_groups(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(status, error on one line) -> the runs that share it, in the runs' order: a cause that failed
    fifteen runs (a machine without a GPU, in sweeps from before such a job failed as a whole) is
    told once, with how many and where."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["status"], " ".join((run["error"] or "no message").split())), []).append(run)
    return groups


def runs_text(runs: Sequence[dict[str, Any]], shown: list[tuple[str, str]], grid: bool,
              variants: bool = False) -> str:
    """Where one run or a group of runs was measured: 'batch 100 (BLOCK=64)' for one, '15 runs (batch
    100, 1000 and 10000)' for several; `variants` names the variants first (a list across variants)."""
    if len(runs) == 1:
        run = runs[0]
        where = ", ".join(f"{heading} {_text(run[column])}" for column, heading in shown)
        setting = f" ({tunables(run['params'])})" if grid else ""
        return f"{run['variant']}{setting}, {where}" if variants else f"{where}{setting}"
    parts = [_values(runs, "variant")] if variants else []
    parts += [f"{heading} {_values(runs, column)}" for column, heading in shown]
    settings = len({tunables(run["params"]) for run in runs})
    if grid and settings > 1:
        parts.append(f"{settings} settings")
    return f"{len(runs)} runs ({'; '.join(parts)})"


def _values(runs: Sequence[dict[str, Any]], column: str) -> str:
    """The runs' distinct values of a column, in order: '100, 1000 and 10000'."""
    texts = [_text(v) for v in sorted({run[column] for run in runs}, key=lambda v: (v is not None, v or 0))]
    return ", ".join(texts[:-1]) + f" and {texts[-1]}" if len(texts) > 1 else texts[0]


def _evidence(experiment: Experiment, variant: str) -> list:
    """One line per profiled conv kernel of the variant, or why there is none."""
    rows = [row for row in experiment.why if _layer_variant(variant, row["layer"]) == row["variant"]]
    if rows:
        return [Bullets([_evidence_line(row) for row in rows])]
    if _on_cpu(variant):
        return [Paragraph(f"None: `{variant}` runs on the CPU, where Nsight Compute has nothing to profile.")]
    return [Paragraph(f"None taken: no Nsight Compute profile of `{variant}` is stored. An experiment with "
                      "`ncu: true` profiles each conv kernel once, in a job of its own, where ncu is installed.")]


def _layer_variant(label: str, layer: str) -> str | None:
    """The variant a run label puts on a layer: 'naive' everywhere, or 'conv1=a,conv2=b' per layer."""
    if "=" not in label:
        return label
    return dict(part.split("=", 1) for part in label.split(",")).get(layer)


def _on_cpu(variant: str) -> bool:
    from .variants import get_variant

    try:
        return get_variant(variant).is_cpu
    except ConvsweepError:  # a per-layer label, or a variant no longer registered
        return False


def _evidence_line(row: dict[str, Any]) -> str:
    tunables = json_column(row["tunables"])
    setting = f" ({','.join(f'{k}={v}' for k, v in tunables.items())})" if tunables else ""
    facts = [f"ncu {_number(row['ncu time (ms)'])} ms" if row["ncu time (ms)"] is not None else None,
             _pct("SM", row["SM %"]), _pct("DRAM", row["DRAM %"]), _pct("occupancy", row["occupancy %"]),
             f"limited by {row['occupancy limiter']}" if row["occupancy limiter"] else None,
             f"{row['registers']} registers" if row["registers"] is not None else None,
             f"{row['smem/block']} B shared/block" if row["smem/block"] is not None else None,
             _pct("L1 hit", row["L1 hit %"]), _pct("L2 hit", row["L2 hit %"])]
    detail = "; ".join(fact for fact in facts if fact)
    return f"batch {row['batch']}, {row['layer']} `{row['kernel']}`{setting}: **{row['why']}**" + (
        f" ({detail})" if detail else "")


def _winners_section(experiment: Experiment) -> list:
    """Each layer and batch whose fastest settings were measured again, interleaved: the confirmed winner, the
    settings tied with it, and whether the first ranking held; said first where it was overturned."""
    rows = experiment.winners
    if not rows:
        return []
    overturned = [row for row in rows if row["ranking"] == "overturned"]
    said = (f"The confirmation **overturned the first ranking** in {len(overturned)} of {len(rows)}: "
            + "; ".join(f"{row['layer']} at batch {row['batch']}, `{row['first winner']}` is {row['first winner now']} "
                        f"behind `{row['confirmed winner']}`" for row in overturned) + "."
            if overturned else f"The confirmation kept the first ranking's winner in all {len(rows)}.")
    table = [[row["layer"], str(row["batch"]), _setting(row["confirmed winner"], row["tunables"]),
              _number(row["confirmed (ms)"]), str(row["tied"]), _number(row["detectable (ms)"]),
              _setting(row["first winner"], row["first tunables"]), row["ranking"]]
             for row in rows]
    return [Heading(2, "Winners confirmed"),
            Paragraph("Per conv layer and batch, the fastest settings measured again in one process, one pass of each "
                      "in turn over the rounds (`confirm:` in the sweep): the winner by its median, how many settings a "
                      "paired test could not tell from it, and the smallest difference from the runner-up those rounds "
                      "would have found. " + said + " `convsweep query winners` and `query best` have every column."),
            Table(["layer", "batch", "confirmed winner", "confirmed (ms)", "tied", "detectable (ms)", "first winner",
                   "ranking"], table, [False, True, False, True, True, True, False, False])]


def _setting(variant: str, params) -> str:
    """'`naive` BLOCK=64': a layer's variant and its tunables."""
    values = json_column(params) or {}
    return f"`{variant}`" + (" " + ",".join(f"{k}={v}" for k, v in values.items()) if values else "")


def _figure_section(experiment: str, figures: Sequence[Path], figures_dir: Path | None) -> list:
    blocks: list = [Heading(2, "Figures")]
    if not figures:
        where = f" in {figures_dir}" if figures_dir else ""
        return blocks + [Paragraph(f"No figures{where}: `convsweep report --experiment {experiment} --draw` "
                                   "draws them.")]
    for path in figures:
        blocks.append(Figure(path, path.stem, _figure_text(path.stem)))
    missing = [kind for kind in KINDS if kind not in {path.stem for path in figures}]
    if missing:
        blocks.append(Paragraph(f"Not drawn, for want of data: {', '.join(missing)} "
                                f"(`convsweep plot KIND --experiment {experiment}` says why)."))
    return blocks


def _figure_text(kind: str) -> str:
    """What a figure shows, as its registry entry says; a PNG of no registered kind, its name."""
    return (FIGURES[kind].description if kind in FIGURES else "") or kind


# -- cells -------------------------------------------------------------------------------------------
def _number(value: Any) -> str:
    """Four significant digits, trailing zeros kept so a column reads evenly, never in exponent form."""
    if value is None:
        return ""
    value = float(value)
    return f"{value:.0f}" if abs(value) >= 999.95 else f"{value:#.4g}"


def _percent(fraction: Any) -> str:
    return "" if fraction is None else f"{100 * float(fraction):.1f}"


def _fixed(value: Any, digits: int) -> str:
    return "" if value is None else f"{float(value):.{digits}f}"


def _times(ratio: float | None) -> str:
    """Three significant digits, trailing zeros kept (1.30×, 12.2×, 124×)."""
    if ratio is None:
        return NO_VALUE
    return f"{ratio:.{2 if ratio < 9.995 else 1 if ratio < 99.95 else 0}f}×"


def _pct(name: str, value: Any) -> str | None:
    return None if value is None else f"{name} {float(value):.0f}%"


def _text(value: Any) -> str:
    return "auto" if value is None else str(value)


# -- tables as data ----------------------------------------------------------------------------------
SEEDS_CSV_COLUMNS = ["variant", "tunables", *(heading for _, heading in CELL_COLUMNS), "status", "checks",
                     "op time 1 (ms)", "op time 1 ±%", "op time 2 (ms)", "op time 2 ±%", "op time (ms)",
                     "forward (ms)", "forward ±%", "total (s)", "accuracy", "previous", "× over previous",
                     f"× over {BASELINE_VARIANT}", "error"]


def seeds_rows(experiment: Experiment) -> list[list[Any]]:
    """Every run of the experiment with its speedups (an ok run's: a suspect, incorrect or failed run's time
    counts for nothing), in report order: the CSV beside the report."""
    order = variant_order(experiment.runs)
    best = fastest(experiment.runs)
    rows = []
    for index, variant in enumerate(order):
        previous = order[index - 1] if index > 0 else None
        for run in sorted((r for r in experiment.runs if r["variant"] == variant),
                          key=lambda r: (_cell_order(cell(r)), r["status"] != "ok", r["op_time_ms"] or 0)):
            rows.append([variant, tunables(run["params"]), *cell(run), run["status"], run["checks"],
                         run["op_time_1_ms"], _round_percent(run["op_time_1_spread"]),
                         run["op_time_2_ms"], _round_percent(run["op_time_2_spread"]), run["op_time_ms"],
                         run["forward_ms"], _round_percent(run["forward_spread"]), run["total_s"], run["accuracy"],
                         previous, *(_round(speedup(best, over, run)) if run["status"] == "ok" else None
                                     for over in (previous, BASELINE_VARIANT)),
                         run["error"]])
    return rows


def _round_percent(fraction: Any) -> float | None:
    return None if fraction is None else round(100 * float(fraction), 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def why_rows(experiment: Experiment) -> list[list[Any]]:
    return [[row[c] for c in experiment.why_columns] for row in experiment.why]


# -- summary.md --------------------------------------------------------------------------------------
SUMMARY_INTRO = ("The latest measurement of each job's settings (`convsweep query history` has them all); ±% is "
                 "the spread of the median's samples (median absolute deviation over the median).")
SUSPECT_INTRO = ("Their outputs are right, but the integrity checks doubt their times: they are in the table above "
                 "and never count as the fastest.")


def summary_markdown(experiment: Experiment) -> str:
    """summary.md: every run of the experiment in one table (a grid's settings each on its row, with
    the tunables that tell them apart, where a variant ran at several; how each was checked, where one
    was measured with fast checks), then its failed or incorrect runs, then its suspect ones with why."""
    from .query import render

    grid = any(several_settings([run for run in experiment.runs if run["variant"] == variant])
               for variant in {run["variant"] for run in experiment.runs})
    runs = sorted(experiment.runs, key=lambda r: (r["variant"], axes.sort_key(r), r["forward_ms"] is None,
                                                   r["forward_ms"] or 0.0))
    cell_axes = axes.shown(experiment.runs)
    marked = any(fast_checks(run) for run in runs)
    columns = ["variant", *(["setting"] if grid else []), *cell_axes, "status", *(["checks"] if marked else []),
               "op_time_1_ms", "op time 1 ±%", "op_time_2_ms", "op time 2 ±%", "forward_ms", "forward ±%",
               "total_s", "accuracy"]
    rows = [[run["variant"], *([tunables(run["params"])] if grid else []), *(run[name] for name in cell_axes), run["status"],
             *([_checks(run)] if marked else []), run["op_time_1_ms"], _spread(run["op_time_1_spread"]),
             run["op_time_2_ms"], _spread(run["op_time_2_spread"]), run["forward_ms"], _spread(run["forward_spread"]),
             run["total_s"], run["accuracy"]] for run in runs]
    text = f"# {experiment.name}\n\n{SUMMARY_INTRO}\n\n{render(columns, rows, 'table')}\n"
    whole = sorted({run["variant"] for run in runs if whole_network(run["variant"])})
    if whole:
        text += (f"\n{', '.join(whole)} {'runs' if len(whole) == 1 else 'run'} the whole network in one kernel: "
                 "op time 1 is every layer's time, and op time 2 is empty.\n")
    shown = shown_columns(experiment.runs)
    failed = [run for run in runs if run["status"] not in ("ok", "suspect")]
    if failed:  # one row per cause: the table above has each run's status
        rows = [[runs_text(group, shown, grid, variants=True), status, error]
                for (status, error), group in failure_groups(failed).items()]
        text += f"\n## Failed or incorrect\n\n{render(['runs', 'status', 'error'], rows, 'table')}\n"
    suspect = [run for run in runs if run["status"] == "suspect"]
    if suspect:
        rows = [[runs_text(group, shown, grid, variants=True), error]
                for (_, error), group in failure_groups(suspect).items()]
        text += (f"\n## Suspect\n\n{SUSPECT_INTRO}\n\n{render(['runs', 'why'], rows, 'table')}\n")
    if coverage := coverage_section(experiment.coverage, runs, "in Failed or incorrect above"):
        text += "\n" + to_markdown(coverage, Path("."))
    return text


def _spread(fraction: Any) -> str | None:
    """A spread as percent with one decimal (text, so every database prints it alike)."""
    return None if fraction is None else f"{100 * float(fraction):.1f}"


# -- writing -----------------------------------------------------------------------------------------
@dataclass
class Written:
    """What `write` wrote, for the command to print."""

    paths: list[Path] = field(default_factory=list)


def write(url: str | None, experiment: str, markdown: Path | None = None, page: Path | None = None,
          tables: Path | None = None, figures_dir: Path | None = None, summary: Path | None = None,
          allow_empty: bool = False) -> Written:
    """Write the report of `experiment` as Markdown, as an HTML page, as CSV tables (seeds.csv,
    why.csv in `tables`) and as summary.md, each where asked, from one read of the database;
    figures are the PNGs in `figures_dir`. `allow_empty`: an experiment with no run stored gets a
    report saying so (the end of a sweep none of whose jobs finished) instead of an error. Written into the
    experiment's results folder, each lists what its sweep asked for and has no result of (report_coverage)."""
    folder = next((path.parent for path in (summary, markdown, page) if path and path.parent.name == experiment), None)
    try:
        data = load(url, experiment)
    except NoRuns:
        if not allow_empty:
            raise
        why_columns, _ = _rows(url, "why")  # seeds.csv and why.csv keep their headers
        data = Experiment(experiment, [], why_columns)
    data.coverage = read_coverage(folder, {run["job_id"] for run in data.runs})
    if data.coverage is not None:  # a stored run of a job whose last attempt left no result is from before it
        data.runs = [run for run in data.runs if run["job_id"] not in data.coverage.superseded]
    if not data.runs:
        nothing = [Heading(1, f"Report: {experiment}"),
                   Paragraph("No run of this experiment is stored yet." + ("" if data.coverage else " None of its jobs "
                             "has finished: the end of `snakemake` says why; `snakemake` again retries them.")),
                   *coverage_section(data.coverage, [], "")]
        return _write_blocks(data, nothing, markdown, page, tables, summary)
    return _write_blocks(data, build(data, figure_files(figures_dir), figures_dir), markdown, page, tables, summary)


def _write_blocks(data: Experiment, blocks: list, markdown: Path | None, page: Path | None, tables: Path | None,
                  summary: Path | None) -> Written:
    from .query import render

    done = Written()
    experiment = data.name
    directories = [path.parent for path in (summary, markdown, page) if path is not None]
    for directory in directories + ([tables] if tables is not None else []):
        checked_directory(directory)  # a link another user made is refused, before any file is written
    if summary is not None:
        write_atomic(summary, summary_markdown(data) if data.runs else to_markdown(blocks, summary.parent))
        done.paths.append(summary)
    if markdown is not None:
        write_atomic(markdown, to_markdown(blocks, markdown.parent))
        done.paths.append(markdown)
    if page is not None:
        write_atomic(page, to_html(blocks, f"Report: {experiment}"))
        done.paths.append(page)
    if tables is not None:
        write_atomic(tables / "seeds.csv", render(SEEDS_CSV_COLUMNS, seeds_rows(data), "csv"))
        write_atomic(tables / "why.csv", render(data.why_columns, why_rows(data), "csv"))
        done.paths += [tables / "seeds.csv", tables / "why.csv"]
    return done
