"""What every figure is drawn with: a Figure on the Agg canvas, its sizes, the title and wrapped
caption, log axes with plain tick labels, side legends, each series' color and line, and the PNG
written whole.

matplotlib is imported only inside these functions, when a figure is drawn, and figures go to the
Agg canvas directly, never through pyplot, so a caller's backend is left alone.
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..axes import set_apart
from ..errors import ConvsweepError

DPI = 120
PANEL_WIDTH_IN = 5.0
PANEL_HEIGHT_IN = 3.8
LEGEND_WIDTH_IN = 2.4
CAPTION_FONT_PT = 8
CAPTION_CHARS_PER_INCH = 16  # DejaVu Sans at 8 pt averages about 4.4 pt a character (17 let a line of wide ones run off)
BATCH_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
VARIANT_LINESTYLES = ("-", "--", ":", "-.")


def matplotlib_classes() -> tuple[type, type]:
    """matplotlib's Figure and Agg canvas classes, or one line saying how to install them."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConvsweepError("figures need matplotlib, which `pip install -e .` installs") from None
    return Figure, FigureCanvasAgg


def new_figure(rows: int, cols: int, width_in: float, height_in: float, **subplots: Any):
    """A Figure on the Agg canvas with constrained layout, and its axes as a rows x cols array."""
    figure_class, canvas_class = matplotlib_classes()
    fig = figure_class(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    canvas_class(fig)
    return fig, fig.subplots(rows, cols, squeeze=False, **subplots)


def figure_width(panels: int) -> float:
    """Inches for `panels` panels side by side and the legend beside them."""
    return PANEL_WIDTH_IN * panels + LEGEND_WIDTH_IN


def finish(fig, title: str, caption: str):
    """Title the figure and write the caption under the axes, wrapped to the figure's width, with
    room kept for it so that nothing overlaps."""
    fig.suptitle(title, fontsize=13, fontweight="bold")
    text = "\n".join(textwrap.wrap(caption, int(fig.get_figwidth() * CAPTION_CHARS_PER_INCH), break_on_hyphens=False))
    lines = text.count("\n") + 1
    height = (lines * CAPTION_FONT_PT * 1.3 + 10) / 72 / fig.get_figheight()
    fig.text(0.01, 0.006, text, ha="left", va="bottom", fontsize=CAPTION_FONT_PT, color="0.2")
    fig.get_layout_engine().set(rect=(0, height, 1, 1 - height))
    return fig


def runs_note(shown: Sequence[dict[str, Any]], experiment: str, stored: Sequence[dict[str, Any]] = ()) -> str:
    """How many runs the figure shows, and how many of the stored ones it leaves out by status."""
    shown_ids = {r["run_id"] for r in shown}
    left_out = {r["run_id"]: r["status"] if r["status"] != "ok" else "ok without a time or floors"
                for r in stored if r["run_id"] not in shown_ids}
    statuses = sorted(set(left_out.values()))
    why = "; left out: " + ", ".join(f"{list(left_out.values()).count(st)} {st}" for st in statuses) \
        if left_out else ""
    return f"{len(shown_ids)} runs of experiment {experiment}, the latest measurement of each setting{why}."


def save(fig, path: Path) -> None:
    """Write the PNG through a temporary name, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    # zlib's fastest level: a quarter less time per figure than the default, and no larger files here
    fig.savefig(partial, format="png", pil_kwargs={"compress_level": 1})
    partial.replace(path)


# -- axes ------------------------------------------------------------------------------------------------
def batch_axis(ax, batches: Sequence[int]) -> None:
    """A log x axis marked at the batches measured, and only there."""
    ax.set_xscale("log")
    ax.set_xticks(list(batches), [str(b) for b in batches])
    ax.set_xticks([], minor=True)
    ax.set_xlabel("batch (images)")
    if len(batches) == 1:
        ax.set_xlim(batches[0] / 2, batches[0] * 2)


def plain_log(ax, which: str) -> None:
    """Make the `which` ('x' or 'y') axis logarithmic with plain tick labels (0.1, 1, 1,000 rather
    than powers of ten), and the 2s and 5s between labelled too where it spans little."""
    from matplotlib.ticker import FuncFormatter

    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(FuncFormatter(lambda value, _: tick_text(value)))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: _minor_tick_text(axis, value)))


def tick_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _minor_tick_text(axis, value: float) -> str:
    """A label for the minor ticks 2 and 5 (x a power of ten) on an axis spanning less than about
    one and a half decades; the others stay unlabelled, so labels never crowd."""
    lo, hi = sorted(axis.get_view_interval())
    if value <= 0 or lo <= 0 or hi / lo > 30:
        return ""
    leading = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
    return tick_text(value) if leading in (2, 5) else ""


# -- legends and series ----------------------------------------------------------------------------------
def panel_legend(fig, axes: Iterable, title: str) -> None:
    """One legend at the side for every series drawn in any of `axes`, each once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    side_legend(fig, list(entries.values()), list(entries), title=title)


def side_legend(fig, handles: list, labels: list[str], title: str | None = None) -> None:
    fig.legend(handles, labels, loc="outside right upper", title=title, fontsize=8, title_fontsize=8,
               frameon=False)


def variant_colors(variants: Iterable[str]) -> dict[str, str]:
    """One of matplotlib's cycle colors per variant, by name, so a variant keeps its color across
    the figures of one experiment."""
    return {variant: f"C{i % 10}" for i, variant in enumerate(sorted(set(variants)))}


@dataclass(frozen=True)
class SeriesStyle:
    """How a series is drawn: its variant's color, and dashed lines, hatched bars or hollow markers
    when an axis sets its runs apart (axes.SERIES_AXES: a cold L2), so the plain and the set-apart
    runs of a variant read as a pair."""

    color: str
    apart: bool

    @property
    def linestyle(self) -> str:
        return "--" if self.apart else "-"

    @property
    def hatch(self) -> str | None:
        return "///" if self.apart else None

    def marker_colors(self) -> dict[str, str]:
        return {"color": self.color, "markerfacecolor": "white" if self.apart else self.color,
                "markeredgecolor": self.color if self.apart else "white"}


def series_styles(rows: Iterable[dict[str, Any]]) -> dict[str, SeriesStyle]:
    """Per series (a variant, and what sets its runs apart: a cold L2), by name: how to draw it."""
    rows = list(rows)
    colors = variant_colors(r["variant"] for r in rows)
    return {r["series"]: SeriesStyle(colors[r["variant"]], set_apart(r))
            for r in sorted(rows, key=lambda r: r["series"])}
