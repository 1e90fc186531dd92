"""The phases figure: where each job's wall time went, phase by phase."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from convsweep.base.axes import cell_text, order_by
from convsweep.base.axes import columns as axis_columns
from convsweep.analysis.reading import PROVENANCE_COLUMNS, Ceilings, MissingData, provenance
from .drawing import (LEGEND_WIDTH_IN, MAX_BARS, PANEL_HEIGHT_IN, PANEL_WIDTH_IN, finish, new_figure, runs_note,
                      side_legend)
from .rows import fetch

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# Where a job's wall time goes, in the order it is spent; other phase names follow, sorted.
PHASE_ORDER = ("process_start", "load", "reference", "compile", "gpu_wait", "context", "allocate", "setup",
               "warmup", "timed", "check", "profile", "nsys_read")
PHASE_LABELS = {"process_start": "process start", "gpu_wait": "GPU wait", "warmup": "warm-up",
                "profile": "nsys profile", "nsys_read": "nsys read", "setup": "set-up"}
UNACCOUNTED_PHASE = "other (not split)"


def phase_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """Every run's phases, failed runs too (unlike the phases query): a job's settings share its
    wall time, so its bar adds up only with every one of them."""
    return fetch(url, f"""
        SELECT r.id AS run_id, r.job_id, r.variant, {axis_columns("r")}, r.total_s,
               p.name AS phase, p.seconds, {PROVENANCE_COLUMNS}
        FROM latest_run r
        JOIN environment e ON e.id = r.environment_id
        LEFT JOIN phase p ON p.run_id = r.id
        WHERE r.experiment = :experiment
        ORDER BY r.variant, {order_by("r")}, r.id""", {"experiment": experiment})


def job_phases(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per job: its label, how many settings it measured, seconds per phase and its wall time, its
    settings' shares added up (a job splits what they shared among them, so they add up to it)."""
    jobs: dict[str, dict[str, Any]] = {}
    counted: set[int] = set()
    for row in rows:
        job = jobs.setdefault(row["job_id"], {"label": f"{row['variant']} {cell_text(row)}", "runs": set(),
                                              "variant": row["variant"], "phases": {}, "total_s": 0.0})
        job["runs"].add(row["run_id"])
        if row["run_id"] not in counted:
            counted.add(row["run_id"])
            job["total_s"] += row["total_s"] or 0.0
        if row["phase"] is not None and row["seconds"]:
            job["phases"][row["phase"]] = job["phases"].get(row["phase"], 0.0) + row["seconds"]
    return jobs


def draw(rows: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Each job's wall time as a stacked bar of its phases (start, load, compile, ..., nsys); past MAX_BARS jobs,
    each variant's mean job."""
    jobs = job_phases(rows)
    if not any(job["phases"] for job in jobs.values()):
        raise MissingData(f"experiment {experiment!r} has no run with stored phases")
    names = [p for p in PHASE_ORDER if any(p in j["phases"] for j in jobs.values())]
    names += sorted({p for j in jobs.values() for p in j["phases"]} - set(names))
    grouped = len(jobs) > MAX_BARS
    if grouped:
        bars, grouped_note = variant_bars(jobs)
    else:
        labels = _job_labels(jobs)
        bars, grouped_note = [{**job, "label": labels[job_id]} for job_id, job in jobs.items()], ""
    height_in = max(PANEL_HEIGHT_IN + 1.2, 2.2 + 0.32 * len(bars))
    fig, axes = new_figure(1, 1, PANEL_WIDTH_IN * 1.6 + LEGEND_WIDTH_IN, height_in)
    ax: Axes = axes[0][0]
    _bars(ax, bars, names)
    ax.set_xlabel("wall time (s)" + (", a mean job" if grouped else ""))
    ax.set_ylabel("variant (its jobs' mean)" if grouped else "job (variant and cell, as its id names them)")
    ax.invert_yaxis()
    ax.margins(y=0.01)
    ax.grid(True, axis="x", alpha=0.3)
    side_legend(fig, *ax.get_legend_handles_labels(), title="phase")
    note = ("Phases as each job recorded them; a job of several settings shares its start, load, compile and "
            "nsys time among them, and its bar adds them up. "
            f"'{UNACCOUNTED_PHASE}': wall time that no recorded phase covers.{grouped_note}")
    return finish(fig, f"Where each job's wall time went: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


def variant_bars(jobs: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Past MAX_BARS jobs, one bar per variant: its mean job (each phase's seconds and the wall time over its
    jobs), by name; past MAX_BARS variants, those with the most wall time in all, the rest as one bar. And the
    caption's sentence saying so."""
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for job in jobs.values():
        by_variant.setdefault(job["variant"], []).append(job)
    kept = set(sorted(by_variant, key=lambda v: -sum(job["total_s"] for job in by_variant[v]))[:MAX_BARS - 1]
               if len(by_variant) > MAX_BARS else by_variant)
    groups = [(variant, by_variant[variant]) for variant in sorted(kept)]
    rest = [job for variant, group in by_variant.items() if variant not in kept for job in group]
    if rest:
        groups.append((f"{len(by_variant) - len(kept):,} other variants", rest))
    bars = []
    for name, group in groups:
        phases: dict[str, float] = {}
        for job in group:
            for phase, seconds in job["phases"].items():
                phases[phase] = phases.get(phase, 0.0) + seconds
        bars.append({"label": f"{name}: mean of {len(group):,} job{'s' * (len(group) != 1)}",
                     "phases": {phase: seconds / len(group) for phase, seconds in phases.items()},
                     "total_s": sum(job["total_s"] for job in group) / len(group)})
    note = (f" {len(jobs):,} jobs, more than the {MAX_BARS} drawn one by one: each bar is a variant's mean job, each "
            "phase's seconds and the wall time over its jobs (how many in its label)"
            + (f"; the {len(by_variant) - len(kept):,} variants with the least wall time in all share the last bar"
               if rest else "") + ".")
    return bars, note


def _job_labels(jobs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A bar label per job; the job id is added where two jobs would read the same."""
    seen: dict[str, int] = {}
    for job in jobs.values():
        seen[job["label"]] = seen.get(job["label"], 0) + 1
    labels = {}
    for job_id, job in jobs.items():
        label = job["label"] + (f" ({len(job['runs'])} settings)" if len(job["runs"]) > 1 else "")
        labels[job_id] = label + (f" [{job_id[-10:]}]" if seen[job["label"]] > 1 else "")
    return labels


def _bars(ax, bars: list[dict[str, Any]], names: list[str]) -> None:
    """One stacked bar per job (or variant): its phases in `names` order, then the wall time no phase covers."""
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    left = [0.0] * len(bars)
    color: str | tuple[float, float, float, float]
    for k, name in enumerate([*names, UNACCOUNTED_PHASE]):
        if name == UNACCOUNTED_PHASE:
            widths = [max(0.0, bar["total_s"] - sum(bar["phases"].values())) for bar in bars]
            color = "0.85"
        else:
            widths = [bar["phases"].get(name, 0.0) for bar in bars]
            color = palette(2 * k % 20 + 2 * k // 20 % 2)  # the dark shades first, then the light ones
        if any(widths):
            ax.barh(range(len(bars)), widths, left=left, color=color, label=PHASE_LABELS.get(name, name),
                    edgecolor="white", linewidth=0.5)
            left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(bars)), [bar["label"] for bar in bars], fontsize=8)
