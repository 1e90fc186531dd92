"""What every figure is drawn with: a Figure on the Agg canvas, its sizes, the title and wrapped
caption, log axes with plain tick labels, side legends, each series' color and line, how much a figure
draws one by one before it groups or picks (and its text, before it is shortened), and the PNG written
whole.

matplotlib is imported only inside these functions, when a figure is drawn, and figures go to the
Agg canvas directly, never through pyplot, so a caller's backend is left alone.
"""
from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from convsweep.base.axes import set_apart
from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import write_atomic

if TYPE_CHECKING:
    class MarkerColors(TypedDict):
        """Line2D's colors of a series' markers (SeriesStyle.marker_colors)."""

        color: str
        markerfacecolor: str
        markeredgecolor: str

DPI = 120
PANEL_WIDTH_IN = 5.0
PANEL_HEIGHT_IN = 3.8
LEGEND_WIDTH_IN = 2.4
CAPTION_FONT_PT = 8
CAPTION_CHARS_PER_INCH = 16  # DejaVu Sans at 8 pt averages about 4.4 pt a character (17 let a line of wide ones run off)
BATCH_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
VARIANT_LINESTYLES = ("-", "--", ":", "-.")

# Past these sizes a figure groups or picks what it draws, and its caption says so, so that its time and
# memory stop growing with the store: each bar, panel, tick label and legend entry costs layout time, and a
# figure tall or wide enough to hold thousands of them, memory (issue 52: 10,000 jobs' phases took 198 s).
MAX_BARS = 40  # bars in one panel, one per job (phases) before one per variant
MAX_COLUMNS = 4  # panels side by side (tuning's and streams' batches, pareto's cells)
MAX_ROWS = 3  # rows of panels (tuning's conv layers, pareto's cells)
MAX_BAR_GROUPS = 12  # groups of bars along one axis (speedup's batches)
MAX_TICK_LABELS = 30  # labels along one axis: batches measured, commits
MAX_LEGEND_ENTRIES = 24
# Text from stored data (a GPU, variant, experiment or layer name) is shortened in the middle to these.
LABEL_MAX_CHARS = 80  # a title, axis label, tick label, legend entry or note in a panel
CAPTION_SENTENCE_MAX_CHARS = 600  # one sentence of a caption (the longest convsweep writes is about 350)
CAPTION_MAX_CHARS = 3000
ELLIPSIS = "…"


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
    room kept for it so that nothing overlaps. Every text is shortened first (shorten_texts)."""
    fig.suptitle(title, fontsize=13, fontweight="bold")
    shorten_texts(fig)
    text = "\n".join(textwrap.wrap(caption_text(caption), int(fig.get_figwidth() * CAPTION_CHARS_PER_INCH),
                                   break_on_hyphens=False))
    lines = text.count("\n") + 1
    height = (lines * CAPTION_FONT_PT * 1.3 + 10) / 72 / fig.get_figheight()
    fig.text(0.01, 0.006, text, ha="left", va="bottom", fontsize=CAPTION_FONT_PT, color="0.2", parse_math=False)
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
    """Write the PNG whole (write_atomic: a reader never sees half a file, and a link planted at its name
    is replaced, never written through)."""
    png = io.BytesIO()
    # zlib's fastest level: a quarter less time per figure than the default, and no larger files here
    fig.savefig(png, format="png", pil_kwargs={"compress_level": 1})
    write_atomic(path, png.getvalue())


# -- text and sizes --------------------------------------------------------------------------------------
def shorten(text: str, limit: int = LABEL_MAX_CHARS) -> str:
    """`text` cut to `limit` characters in its middle, where it is longer: its start and end stay, so two
    labels that differ at their end (a job id) stay apart."""
    if len(text) <= limit:
        return text
    head = (limit - len(ELLIPSIS) + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (limit - len(ELLIPSIS) - head):]


def caption_text(caption: str) -> str:
    """A caption with each sentence shortened (a 30,000-character GPU name cuts its own sentence only), then
    the whole."""
    return shorten(". ".join(shorten(sentence, CAPTION_SENTENCE_MAX_CHARS) for sentence in caption.split(". ")),
                   CAPTION_MAX_CHARS)


def shorten_texts(fig) -> None:
    """Shorten every text of the figure (titles, axis and tick labels, legend entries, notes in panels): the one
    place that holds a long stored name (a GPU's, a variant's) from stretching the layout past what it can
    solve. Tick labels are made when drawn, so each axis's formatters are wrapped."""
    from matplotlib.text import Text

    for artist in fig.findobj(Text):
        # Literal: a `$` in a stored name (a GPU's `NVIDIA $\frac{1}{$ H100`) read as math markup stopped every
        # figure and the report with a parse error. convsweep writes no math markup of its own.
        artist.set_parse_math(False)
        if len(artist.get_text()) > LABEL_MAX_CHARS:
            artist.set_text(shorten(artist.get_text()))
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):  # axes that share one ticker wrap it once
            if not getattr(axis.get_major_formatter(), "shortens", False):
                axis.set_major_formatter(_shortening(axis.get_major_formatter()))
            if not getattr(axis.get_minor_formatter(), "shortens", False):
                axis.set_minor_formatter(_shortening(axis.get_minor_formatter()))


def _shortening(formatter):
    """A tick formatter that shortens what `formatter` writes, and escapes a `$` in it (tick labels are made when
    drawn, as math markup where they hold one) unless the formatter writes math markup itself (matplotlib's log
    formatters: `$10^{2}$`)."""
    from matplotlib.ticker import Formatter, LogFormatterMathtext

    literal = not isinstance(formatter, LogFormatterMathtext)

    def shown(label: str) -> str:
        label = shorten(label)
        return label.replace("$", r"\$") if literal else label

    class Shortened(Formatter):
        shortens = True

        def __call__(self, x, pos=None):
            return shown(formatter(x, pos))

        def format_ticks(self, values):
            return [shown(label) for label in formatter.format_ticks(values)]

        def set_locs(self, locs):
            formatter.set_locs(locs)

        def get_offset(self):
            return formatter.get_offset()

    return Shortened()


def spread(values: Sequence, most: int) -> list:
    """At most `most` of `values` (in their order), evenly spread from the first to the last, both kept."""
    values = list(values)
    if len(values) <= most:
        return values
    if most <= 1:
        return values[-1:]
    return [values[round(k * (len(values) - 1) / (most - 1))] for k in range(most)]


def listed(values: Sequence, most: int = 10) -> str:
    """'1, 2, 4' or, past `most` values, '1, 2, 4, ... and 997 more'."""
    shown = ", ".join(str(v) for v in values[:most])
    return shown + (f" and {len(values) - most:,} more" if len(values) > most else "")


def picked_note(shown: int, total: int, what: str, how: str = "evenly spread from the first to the last") -> str:
    """'4 of 200 batches shown, evenly spread from the first to the last.' where a figure picked, else ''."""
    return f" {shown} of {total:,} {what} shown, {how}." if shown < total else ""


# -- axes ------------------------------------------------------------------------------------------------
def many_batches_note(batches: Sequence[int]) -> str:
    """What batch_axis and the lines over it do past MAX_TICK_LABELS batches, for a caption; else ''."""
    return (f" {len(batches):,} batches, more than the {MAX_TICK_LABELS} marked one by one: each line runs through all "
            "of them, unmarked, ticks at round numbers." if len(batches) > MAX_TICK_LABELS else "")


def batch_axis(ax, batches: Sequence[int]) -> None:
    """A log x axis marked at the batches measured, and only there; past MAX_TICK_LABELS of them, at round
    numbers."""
    if len(batches) > MAX_TICK_LABELS:
        plain_log(ax, "x")
    else:
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
    """A legend beside the panels; past MAX_LEGEND_ENTRIES, the first of them and how many more."""
    if len(labels) > MAX_LEGEND_ENTRIES:
        from matplotlib.lines import Line2D

        more = len(labels) - MAX_LEGEND_ENTRIES + 1
        handles = [*handles[:MAX_LEGEND_ENTRIES - 1], Line2D([], [], linestyle="none")]
        labels = [*labels[:MAX_LEGEND_ENTRIES - 1], f"{ELLIPSIS} and {more:,} more"]
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

    def marker_colors(self) -> MarkerColors:
        return {"color": self.color, "markerfacecolor": "white" if self.apart else self.color,
                "markeredgecolor": self.color if self.apart else "white"}


def series_styles(rows: Iterable[dict[str, Any]]) -> dict[str, SeriesStyle]:
    """Per series (a variant, and what sets its runs apart: a cold L2), by name: how to draw it."""
    rows = list(rows)
    colors = variant_colors(r["variant"] for r in rows)
    return {r["series"]: SeriesStyle(colors[r["variant"]], set_apart(r))
            for r in sorted(rows, key=lambda r: r["series"])}
