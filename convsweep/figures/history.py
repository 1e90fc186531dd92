"""The history figure: each job's Op Time across its measurements in commit order, with the steps
convsweep.analysis.history found (`convsweep query regressions` lists them)."""
from __future__ import annotations

from typing import Any

from convsweep.analysis.reading import Ceilings, MissingData, provenance
from .drawing import MAX_TICK_LABELS, PANEL_HEIGHT_IN, PANEL_WIDTH_IN, finish, new_figure

MAX_PANELS = 12  # jobs drawn, one small panel each: those with steps first, then the most measured
COLUMNS = 3
STEP_COLORS = {"SLOWER": "C3", "FASTER": "C2"}
SHORT_HASH = 7


def history_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """One row per ok or suspect measurement of every job of `experiment`, in the order measured: its median Op
    Time and interval, its job, and the step that starts at it (None where none does)."""
    from convsweep.analysis.history import histories

    rows = []
    for job, history in enumerate(histories(url, experiment)):
        steps = {step.run_id: step for step in history.steps}
        for point in history.points:
            rows.append({"run_id": point.run_id, "job": job, "label": _label(history), "status": point.status,
                         "median_ms": point.median_ms, "low_ms": point.low_ms, "high_ms": point.high_ms,
                         "step": steps.get(point.run_id), "searched": history.searched, "gpu": point.gpu,
                         "profiler": history.cell["profiler"], "started_at": point.started_at,
                         "git_commit": point.commit, "git_dirty": point.dirty})
    return rows


def _label(history) -> str:
    return history.job + ("" if history.setting == "defaults" else f" ({history.setting})")


def draw(rows: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Each job's Op Time across its measurements in commit order, one point per measurement with its 95%
    interval, and the steps found in it marked at their commit. One panel per job."""
    jobs: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        jobs.setdefault(row["job"], []).append(row)
    timed = {job: points for job, points in jobs.items()
             if sum(p["status"] == "ok" and bool(p["median_ms"]) for p in points) >= 2}
    if not timed:
        raise MissingData(f"experiment {experiment!r} has no job with two ok measurements: a history needs a job "
                          "measured again (after a commit, `snakemake` re-measures the jobs it touched)")
    slots, ticks = _commit_slots([p for points in timed.values() for p in points])
    ranked = sorted(timed, key=lambda job: (not any(p["step"] for p in timed[job]), -len(timed[job]), job))
    shown = ranked[:MAX_PANELS]
    cols = min(COLUMNS, len(shown))
    grid = -(-len(shown) // cols)
    fig, axes = new_figure(grid, cols, PANEL_WIDTH_IN * cols, PANEL_HEIGHT_IN * grid + 1.6, sharex=True)
    for ax, job in zip(axes.flat, shown):
        _panel(ax, timed[job], slots)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    every = -(-len(ticks) // MAX_TICK_LABELS)  # past MAX_TICK_LABELS commits, every n-th named
    for ax in axes.flat[:len(shown)]:
        ax.set_xticks(range(0, len(ticks), every), ticks[::every], rotation=90, fontsize=7)
        ax.tick_params(labelbottom=True)
    for row in axes:
        row[0].set_ylabel("Op Time (ms)")
    drawn = [p for job in shown for p in timed[job]]
    steps = [p["step"] for p in drawn if p["step"]]
    left = len(timed) - len(shown)
    note = (f"{len(shown)} job{'s' * (len(shown) != 1)} of experiment {experiment} with two ok measurements or more"
            + (f" ({left} more without steps left out: `convsweep query regressions` lists every step)" if left else "")
            + f", {sum(p['status'] == 'ok' for p in drawn)} ok measurements. Each point: one measurement's median "
            "Op Time (its conv layers' op times added up, pass by pass), its bar the 95% bootstrap interval over its "
            "samples; x: the commits in the order measured (* a dirty tree"
            + (f"; {len(ticks):,} of them, every {every}th named" if every > 1 else "") + "). "
            + ("Hollow: suspect runs, whose times the integrity checks doubt, never counted for a step. "
               if any(p["status"] == "suspect" for p in drawn) else "")
            + f"Vertical lines: {len(steps)} step{'s' * (len(steps) != 1)}, change points ruptures' Pelt proposed on "
            "the log-medians, each confirmed by a bootstrap verdict on the pooled samples either side (red slower, "
            "green faster, beyond 5%), labelled with the first commit after it."
            + (" CPU-timed jobs are drawn but not searched for steps (host times)."
               if any(not p["searched"] for p in drawn) else ""))
    return finish(fig, f"Op Time across commits per job: {experiment}", f"{provenance(drawn)} {note}")


def _commit_slots(points: list[dict[str, Any]]) -> tuple[dict[int, float], list[str]]:
    """x per run and the tick labels: the measurements in the order taken, a new slot at each change of commit (or
    of a dirty tree), so one sweep's jobs share a slot; a job measured twice in one slot is spread across it."""
    ordered = sorted(points, key=lambda p: (p["started_at"] is None, str(p["started_at"] or ""), p["run_id"]))
    ticks: list[str] = []
    slot_of: dict[int, int] = {}
    last = object()
    for p in ordered:
        key = (p["git_commit"], bool(p["git_dirty"]))
        if key != last:
            ticks.append(_commit_label(p["git_commit"], p["git_dirty"]))
            last = key
        slot_of[p["run_id"]] = len(ticks) - 1
    together: dict[tuple, list[int]] = {}
    for p in ordered:
        together.setdefault((p["job"], slot_of[p["run_id"]]), []).append(p["run_id"])
    x: dict[int, float] = {}
    for (_, slot), runs in together.items():
        for k, run_id in enumerate(runs):
            x[run_id] = slot + ((k + 0.5) / len(runs) - 0.5) * 0.6
    return x, ticks


def _commit_label(commit: str | None, dirty: bool | None) -> str:
    """A commit as the x axis and the step lines name it: its short hash, * where the tree was dirty."""
    return (str(commit)[:SHORT_HASH] if commit else "?") + ("*" if dirty else "")


def _panel(ax, points: list[dict[str, Any]], x: dict[int, float]) -> None:
    ok = [p for p in points if p["status"] == "ok" and p["median_ms"]]
    xs, ys = [x[p["run_id"]] for p in ok], [p["median_ms"] for p in ok]
    below = [p["median_ms"] - p["low_ms"] if p["low_ms"] else 0.0 for p in ok]
    above = [p["high_ms"] - p["median_ms"] if p["high_ms"] else 0.0 for p in ok]
    ax.errorbar(xs, ys, yerr=[below, above], color="C0", marker="o", markersize=4, linestyle="-", linewidth=1,
                capsize=2, label="ok")
    suspect = [p for p in points if p["status"] == "suspect" and p["median_ms"]]
    if suspect:
        ax.plot([x[p["run_id"]] for p in suspect], [p["median_ms"] for p in suspect], linestyle="none", marker="o",
                markersize=5, markerfacecolor="white", markeredgecolor="C0", label="suspect")
    for k, p in enumerate(ok):
        step = p["step"]
        if not step:
            continue
        at = (xs[k - 1] + xs[k]) / 2 if k else xs[k]  # between the last point before and the first after
        color = STEP_COLORS.get(step.verdict, "0.3")
        ax.axvline(at, color=color, linestyle="--", linewidth=1, gid="step")
        ax.text(at, 0.98, f" {_commit_label(step.commit, step.dirty)} {(step.ratio - 1) * 100:+.1f}%", color=color,
                fontsize=7, rotation=90, ha="right", va="top", transform=ax.get_xaxis_transform())
    ax.set_title(points[0]["label"], fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(x=0.05, y=0.15)
