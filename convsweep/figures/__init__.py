"""`convsweep plot`: figures from the result store (op time, speedup over naive, roofline, streams,
input formats, job phases, tuning landscape, each job's history across commits, op time against energy
per pass and its front), each with a caption saying what was measured where.

FIGURES is the registry: every kind in the order it is drawn and reported, the rows it reads and
the module that draws them. Adding a figure is one module in this package and one line there. Where the
PNGs go is said here too: a stored name is made a safe file name (paths.safe_name), and a directory that
would take them elsewhere is refused (fileio.checked_directory). The package imports nothing heavy: the
command line reads KINDS before any command runs, and matplotlib is loaded only when a figure is drawn
(see drawing).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import checked_directory
from convsweep.base.paths import RESULTS_DIR, results_directory, safe_name
from convsweep.analysis.reading import Ceilings, MissingData, load_ceilings
from . import formats, history, op_time, pareto, phases, roofline, speedup, streams, tuning
from .drawing import matplotlib_classes, save
from .rows import experiments, layer_rows


@dataclass(frozen=True)
class FigureKind:
    """A kind of figure: `rows(url, experiment)` reads what it shows, `draw(rows, experiment, ceilings)`
    makes the matplotlib Figure, or raises MissingData when the rows lack what it needs."""

    rows: Callable[[str | None, str], list[dict[str, Any]]]
    draw: Callable[[list[dict[str, Any]], str, Ceilings | None], Any]

    @property
    def description(self) -> str:
        """What the figure shows: the first sentence of its drawing function's docstring."""
        doc = " ".join((self.draw.__doc__ or "").split())
        return doc.split(". ")[0].rstrip(".") + "." if doc else ""


FIGURES: dict[str, FigureKind] = {
    "op-time": FigureKind(layer_rows, op_time.draw),
    "speedup": FigureKind(layer_rows, speedup.draw),
    "roofline": FigureKind(layer_rows, roofline.draw),
    "streams": FigureKind(streams.stream_rows, streams.draw),
    "formats": FigureKind(formats.format_rows, formats.draw),
    "phases": FigureKind(phases.phase_rows, phases.draw),
    "tuning": FigureKind(layer_rows, tuning.draw),
    "history": FigureKind(history.history_rows, history.draw),
    "pareto": FigureKind(pareto.pareto_rows, pareto.draw),
}
KINDS = tuple(FIGURES)


@dataclass
class Plotted:
    """What `plot` did: the PNG files written, and the figures it skipped as (kind, why)."""

    paths: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def figure(kind: str, experiment: str, url: str | None = None, ceilings: Ceilings | None = None):
    """One figure of one experiment, not yet saved: a matplotlib Figure; MissingData when the
    database lacks what it needs."""
    if kind not in FIGURES:
        raise ConvsweepError(f"unknown figure {kind!r}: expected one of {', '.join(KINDS)} or all")
    entry = FIGURES[kind]
    return entry.draw(entry.rows(url, experiment), experiment, ceilings)


def plot(kind: str, url: str | None = None, experiment: str | None = None, out: str | Path | None = None,
         bench: str | Path | None = None) -> Plotted:
    """Draw `kind` (or all kinds) for `experiment` (or every stored one) and write PNGs to `out`
    (default results/<experiment>/figures, or results/figures for every experiment, where a stored name
    becomes a safe file name: paths.safe_name). A directory that would take the files elsewhere is
    refused (fileio.checked_directory)."""
    kinds = KINDS if kind == "all" else (kind,)
    if kind != "all" and kind not in FIGURES:
        raise ConvsweepError(f"unknown figure {kind!r}: expected one of {', '.join(KINDS)} or all")
    matplotlib_classes()  # no matplotlib: one line now, before the database is read
    ceilings = load_ceilings(bench) if bench else None
    chosen = _experiments(url, experiment)
    directory = checked_directory(out) if out else checked_directory(
        results_directory(experiment, "figures") if experiment else results_directory("figures"), below=RESULTS_DIR)
    tasks = [(k, name, url, ceilings, directory / (f"{k}.png" if experiment else f"{safe_name(name)}-{k}.png"))
             for name in chosen for k in kinds]
    done = Plotted()
    for k, (path, why) in zip([t[0] for t in tasks], _draw_all(tasks)):
        if path is None:
            done.skipped.append((k, cast(str, why)))  # no figure: why not
        else:
            done.paths.append(path)
    if not done.paths:
        raise MissingData(done.skipped[0][1] if len(done.skipped) == 1 else
                          "no figure to draw: " + "; ".join(f"{k}: {why}" for k, why in done.skipped))
    return done


def draw(url: str | None, experiment: str, out: Path, bench: str | Path | None = None) -> Plotted:
    """Every figure of `experiment` the database has data for, into `out` (made even when none is):
    a kind without data is skipped with the reason, and a stale PNG of it is removed. `bench`: a
    `convsweep bench --json` file, the roofline's ceilings."""
    checked_directory(out).mkdir(parents=True, exist_ok=True)
    try:
        done = plot("all", url=url, experiment=experiment, out=out, bench=bench)
    except MissingData as e:
        done = Plotted(skipped=[("all", str(e))])
    drawn = {path.stem for path in done.paths}
    for kind in KINDS:
        if kind not in drawn:
            (out / f"{kind}.png").unlink(missing_ok=True)  # a link there goes, never what it points to
    return done


def figure_files(directory: Path | None) -> list[Path]:
    """The PNG figures in `directory`, in the order of KINDS, then the others by name; a link is none (a
    report would embed whatever it points to)."""
    if directory is None or not directory.is_dir():
        return []
    return sorted((p for p in directory.glob("*.png") if not p.is_symlink()),
                  key=lambda p: (KINDS.index(p.stem) if p.stem in KINDS else len(KINDS), p.name))


def _draw_all(tasks: list[tuple]) -> list[tuple[Path | None, str | None]]:
    """Draw and save each task's figure, in order. The figures of one experiment that read the same rows (the
    conv layer rows: op-time, speedup, roofline, tuning) are drawn one after another from one read of them;
    those groups are independent, and laying out and rasterising a figure is about half a second of one CPU
    core, so several are drawn at once, each in a process forked once matplotlib and the query code are
    loaded (where fork is the platform's way: Linux). Each reads the database through its own connection
    (query.fetch opens one a call)."""
    import multiprocessing
    import os
    import sys

    from convsweep.analysis import query  # noqa: F401  loaded once, before the fork, not once per figure

    groups: dict[tuple, list[int]] = {}
    for index, (kind, experiment, *_) in enumerate(tasks):
        groups.setdefault((FIGURES[kind].rows, experiment), []).append(index)
    reads = [[tasks[i] for i in indices] for indices in groups.values()]
    if len(reads) < 2 or not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
        drawn = [_draw_from_one_read(read) for read in reads]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(len(reads), os.cpu_count() or 1),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            drawn = list(pool.map(_draw_from_one_read, reads))
    done: dict[int, tuple[Path | None, str | None]] = {}
    for indices, results in zip(groups.values(), drawn):
        done.update(zip(indices, results))
    return [done[i] for i in range(len(tasks))]


def _draw_from_one_read(tasks: list[tuple]) -> list[tuple[Path | None, str | None]]:
    """Tasks of one experiment whose figures read the same rows: each (the PNG written, None), or (None, why)
    when the database lacks what the figure needs."""
    kind, experiment, url = tasks[0][:3]
    rows = FIGURES[kind].rows(url, experiment)
    done: list[tuple[Path | None, str | None]] = []
    for kind, _, _, ceilings, path in tasks:
        try:
            fig = FIGURES[kind].draw(rows, experiment, ceilings)
        except MissingData as e:
            done.append((None, str(e)))
            continue
        save(fig, path)
        done.append((path, None))
    return done


def _experiments(url: str | None, experiment: str | None) -> list[str]:
    stored = experiments(url)
    if not stored:
        raise MissingData("the database holds no runs: run a sweep first")
    if experiment and experiment not in stored:
        raise MissingData(f"no runs of experiment {experiment!r} in the database (it holds {', '.join(stored)})")
    return [experiment] if experiment else stored
