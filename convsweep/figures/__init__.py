"""`convsweep plot`: figures from the result store (op time, speedup over naive, roofline, streams,
input formats, job phases, tuning landscape, each job's history across commits, op time against energy
per pass and its front), each with a caption saying what was measured where.

FIGURES is the registry: every kind in the order it is drawn and reported, the rows it reads and
the module that draws them. Adding a figure is one module in this package and one line there. The
package imports nothing heavy: the command line reads KINDS before any command runs, and matplotlib
is loaded only when a figure is drawn (see drawing).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConvsweepError
from ..reading import Ceilings, MissingData, load_ceilings
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
    (default results/<experiment>/figures, or results/figures for every experiment)."""
    kinds = KINDS if kind == "all" else (kind,)
    if kind != "all" and kind not in FIGURES:
        raise ConvsweepError(f"unknown figure {kind!r}: expected one of {', '.join(KINDS)} or all")
    matplotlib_classes()  # no matplotlib: one line now, before the database is read
    ceilings = load_ceilings(bench) if bench else None
    chosen = _experiments(url, experiment)
    directory = Path(out) if out else Path("results") / experiment / "figures" if experiment else \
        Path("results") / "figures"
    tasks = [(k, name, url, ceilings, directory / (f"{k}.png" if experiment else f"{name}-{k}.png"))
             for name in chosen for k in kinds]
    done = Plotted()
    for k, (path, why) in zip([t[0] for t in tasks], _draw_all(tasks)):
        if path is None:
            done.skipped.append((k, why))
        else:
            done.paths.append(path)
    if not done.paths:
        raise MissingData(done.skipped[0][1] if len(done.skipped) == 1 else
                          "no figure to draw: " + "; ".join(f"{k}: {why}" for k, why in done.skipped))
    return done


def _draw_all(tasks: list[tuple]) -> list[tuple[Path | None, str | None]]:
    """Draw and save each task's figure, in order. Laying out and rasterising a figure is about half
    a second of one CPU core and the figures are independent, so several are drawn at once, each in
    a process forked once matplotlib and the query code are loaded (where fork is the platform's
    way: Linux). Each reads the database through its own connection (query.fetch opens one a call)."""
    import multiprocessing
    import os
    import sys

    from .. import query  # noqa: F401  loaded once, before the fork, not once per figure

    if len(tasks) < 2 or not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
        return [_draw_one(*task) for task in tasks]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(len(tasks), os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_draw_one, *zip(*tasks)))


def _draw_one(kind: str, experiment: str, url: str | None, ceilings: Ceilings | None,
              path: Path) -> tuple[Path | None, str | None]:
    """(the PNG written, None), or (None, why) when the database lacks what the figure needs."""
    try:
        fig = figure(kind, experiment, url, ceilings)
    except MissingData as e:
        return None, str(e)
    save(fig, path)
    return path, None


def _experiments(url: str | None, experiment: str | None) -> list[str]:
    stored = experiments(url)
    if not stored:
        raise MissingData("the database holds no runs: run a sweep first")
    if experiment and experiment not in stored:
        raise MissingData(f"no runs of experiment {experiment!r} in the database (it holds {', '.join(stored)})")
    return [experiment] if experiment else stored
