"""`convsweep plot`: figures from the result store (op time, speedup over naive, roofline, streams,
job phases, tuning landscape), each with a caption saying what was measured where.

The database is read through convsweep.query (read-only, SQLite or PostgreSQL alike). matplotlib
(the `plot` extra) is imported only when a figure is drawn, and figures go to the Agg canvas
directly, never through pyplot, so a caller's backend is left alone. This module imports nothing
heavy at the top: the command line reads KINDS from it before any command runs.
"""
from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConvsweepError
from .fileio import json_column

KINDS = ("op-time", "speedup", "roofline", "streams", "phases", "tuning")
BASELINE_VARIANT = "naive"
DPI = 120
PANEL_WIDTH_IN = 5.0
PANEL_HEIGHT_IN = 3.8
LEGEND_WIDTH_IN = 2.4
CAPTION_FONT_PT = 8
CAPTION_CHARS_PER_INCH = 17  # DejaVu Sans at 8 pt averages about 4 pt a character
COMMITS_SHOWN = 3
LABELLED_SETTINGS_MAX = 24  # a tuning panel names each setting up to this many, else ranks only
BATCH_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
VARIANT_LINESTYLES = ("-", "--", ":", "-.")
FLOOR_BYTES = "floor bytes"
NCU_BYTES = "DRAM bytes"
NCU_BYTES_MEANING = "DRAM bytes: what Nsight Compute measured the layer's kernels read and write, one pass"
# Each setting's conv layers' DRAM traffic in its latest Nsight Compute profile (table kernel_profile).
NCU_DRAM_BYTES_SQL = """
    SELECT run_key, layer, SUM(dram_read_bytes + dram_write_bytes) AS dram_bytes
    FROM latest_kernel_profile
    GROUP BY run_key, layer"""
FLOOR_BYTES_MEANING = ("floor bytes: what the layer must move at least, its input, weights, bias and output once "
                       "each, not measured DRAM traffic")
# Where a job's wall time goes, in the order it is spent; other phase names follow, sorted.
PHASE_ORDER = ("process_start", "load", "reference", "compile", "gpu_wait", "context", "allocate", "setup",
               "warmup", "timed", "check", "profile", "nsys_read")
PHASE_LABELS = {"process_start": "process start", "gpu_wait": "GPU wait", "warmup": "warm-up",
                "profile": "nsys profile", "nsys_read": "nsys read", "setup": "set-up"}
UNACCOUNTED_PHASE = "other (not split)"
PROVENANCE_COLUMNS = "e.gpu, r.profiler, r.started_at, r.git_commit, r.git_dirty"


class MissingData(ConvsweepError):
    """The database lacks what one figure needs; `plot all` skips that figure and says why."""


@dataclass(frozen=True)
class Ceilings:
    """The device's measured rates from a `convsweep bench --json` file: device-to-device copy
    (read + write, the rate floor bytes move at) and matmul per precision."""

    source: str
    device: str | None
    copy_gbps: float
    matmul_tflops: dict[str, float] = field(default_factory=dict)


@dataclass
class Plotted:
    """What `plot` did: the PNG files written, and the figures it skipped as (kind, why)."""

    paths: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


# -- reading -----------------------------------------------------------------------------------------
def _rows(url: str | None, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a read-only query as dicts (query is imported here: SQLAlchemy is slow to load)."""
    from .query import fetch_dicts

    return fetch_dicts(url, sql, params)[1]


def experiments(url: str | None) -> list[str]:
    """Every experiment with a stored run, by name."""
    return [r["experiment"] for r in _rows(url, "SELECT DISTINCT experiment FROM latest_run ORDER BY experiment", {})]


def layer_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """Every conv layer of the latest measurement of each setting of `experiment`, any status,
    with its op time, floors, tunables and provenance."""
    rows = _rows(url, f"""
        SELECT r.id AS run_id, r.variant, lt.variant AS layer_variant, lt.params, lt.layer_index, lt.layer,
               r.batch, r.streams, r.host_memory, r.cache, r.status, lt.op_time_ms, lt.flops, lt.bytes,
               ncu.dram_bytes, {PROVENANCE_COLUMNS}
        FROM layer_time lt
        JOIN latest_run r ON r.id = lt.run_id
        JOIN environment e ON e.id = r.environment_id
        LEFT JOIN ({NCU_DRAM_BYTES_SQL}) ncu ON ncu.run_key = r.run_key AND ncu.layer = lt.layer
        WHERE r.experiment = :experiment
        ORDER BY lt.layer_index, r.batch, r.id""", {"experiment": experiment})
    for row in rows:
        row["params"] = json_column(row["params"]) or {}
        row["series"] = row["variant"] + whole_network_suffix(row["variant"]) + cache_suffix(row["cache"])
    return rows


def whole_network_suffix(variant: str) -> str:
    """' (whole network)' for a variant whose kernel runs on to the network's end: its first layer's
    op time is every layer's, and a reader comparing it with one conv layer's must be told."""
    from .variants import load_registry

    entry = load_registry().get(variant)
    return " (whole network)" if entry is not None and entry.fuses_tail else ""


def cache_suffix(cache: str | None) -> str:
    """What a series name gains from the L2 state its runs found: nothing when warm (every run
    before cache was an axis), ', cold L2' when written over before each layer."""
    return "" if cache in (None, "warm") else f", {cache} L2"


def timed_layers(rows: Iterable[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
    """The layer rows of ok runs that have an op time (incorrect and failed runs never show as a
    time); MissingData when none has."""
    timed = [r for r in rows if r["status"] == "ok" and r["op_time_ms"]]
    if not timed:
        raise MissingData(f"experiment {experiment!r} has no ok run with conv layer op times")
    return timed


def load_ceilings(path: str | Path) -> Ceilings:
    """The copy bandwidth and matmul rates a `convsweep bench --json` file measured."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConvsweepError(f"--bench {path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ConvsweepError(f"--bench {path}: not JSON ({e})") from None
    ceilings = data.get("ceilings") if isinstance(data, dict) else None
    copy_gbps = ceilings.get("dtod_GBps") if isinstance(ceilings, dict) else None
    if not _positive(copy_gbps):
        raise ConvsweepError(f"--bench {path}: no ceilings.dtod_GBps (the device copy rate): expected the file "
                             "`convsweep bench --json FILE` writes")
    matmul = ceilings.get("matmul_TFLOPps") or {}
    return Ceilings(source=str(path), device=data.get("device"), copy_gbps=float(copy_gbps),
                    matmul_tflops={mode: float(v) for mode, v in matmul.items() if _positive(v)})


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# -- selecting -----------------------------------------------------------------------------------------
def fastest(rows: Iterable[dict[str, Any]], keys: Sequence[str],
            time: str = "op_time_ms") -> tuple[dict[tuple, dict[str, Any]], bool]:
    """The row with the least `time` per value of `keys`, and whether any key held several rows
    (tunable settings, stream counts or host memories the figure does not tell apart)."""
    best: dict[tuple, dict[str, Any]] = {}
    several = False
    for row in rows:
        key = tuple(row[k] for k in keys)
        if key in best:
            several = True
            if row[time] >= best[key][time]:
                continue
        best[key] = row
    return best, several


def conv_layers(rows: Iterable[dict[str, Any]]) -> list[tuple[int, str]]:
    """(layer_index, layer) of the conv layers the rows hold, in network order."""
    return sorted({(r["layer_index"], r["layer"]) for r in rows})


def variant_colors(variants: Iterable[str]) -> dict[str, str]:
    """One of matplotlib's cycle colors per variant, by name, so a variant keeps its color across
    the figures of one experiment."""
    return {variant: f"C{i % 10}" for i, variant in enumerate(sorted(set(variants)))}


@dataclass(frozen=True)
class SeriesStyle:
    """How a series is drawn: its variant's color, and dashed lines, hatched bars or hollow markers
    when its runs found a cold L2, so the warm and cold runs of a variant read as a pair."""

    color: str
    cold: bool

    @property
    def linestyle(self) -> str:
        return "--" if self.cold else "-"

    @property
    def hatch(self) -> str | None:
        return "///" if self.cold else None

    def marker_colors(self) -> dict[str, str]:
        return {"color": self.color, "markerfacecolor": "white" if self.cold else self.color,
                "markeredgecolor": self.color if self.cold else "white"}


def series_styles(rows: Iterable[dict[str, Any]]) -> dict[str, SeriesStyle]:
    """Per series (a variant, and its L2 state when cold), by name: how to draw it."""
    rows = list(rows)
    colors = variant_colors(r["variant"] for r in rows)
    return {r["series"]: SeriesStyle(colors[r["variant"]], r["cache"] not in (None, "warm"))
            for r in sorted(rows, key=lambda r: r["series"])}


def setting_text(variant: str, params: dict[str, Any]) -> str:
    """'naive BLOCK=64' (tunables in the order the run stored them), or 'naive (defaults)' for a
    variant run at its registry defaults."""
    return f"{variant} " + (params_text(params) if params else "(defaults)")


def params_text(params: dict[str, Any]) -> str:
    """'BLOCK_M=4,BLOCK_N=256': tunables in the order the run stored them."""
    return ",".join(f"{k}={v}" for k, v in params.items())


def roofline_bytes(row: dict[str, Any]) -> tuple[int | None, str]:
    """The bytes a roofline point's intensity divides by, and what they are: the DRAM traffic
    Nsight Compute measured for the layer's kernels when the setting was profiled, else its floor."""
    if row.get("dram_bytes"):
        return row["dram_bytes"], NCU_BYTES
    return row["bytes"], FLOOR_BYTES


# -- captions ------------------------------------------------------------------------------------------
def provenance(rows: Sequence[dict[str, Any]]) -> str:
    """'Measured on GPU, dates, at commit(s)' for the runs a figure shows. Only a GPU that a run opened is
    named (a run that failed before opening one stores none), and the CPU for the CPU reference's runs."""
    gpus = sorted({r["gpu"] for r in rows if r["gpu"]} | {"the CPU" for r in rows if not r["gpu"] and
                                                          r.get("profiler") == "cpu"})
    days = sorted({d for d in (_day(r["started_at"]) for r in rows) if d})
    commits = list(dict.fromkeys(str(r["git_commit"])[:10] for r in sorted(
        (r for r in rows if r["git_commit"]), key=lambda r: _day(r["started_at"]) or "")))  # oldest first
    when = "on an unrecorded date" if not days else f"on {days[0]}" if len(days) == 1 \
        else f"from {days[0]} to {days[-1]}"
    shown = ", ".join(commits[:COMMITS_SHOWN]) + (f" and {len(commits) - COMMITS_SHOWN} more"
                                                   if len(commits) > COMMITS_SHOWN else "")
    at = "at an unrecorded commit" if not commits else f"at commit{'s' if len(commits) > 1 else ''} {shown}"
    dirty = " (with uncommitted changes)" if any(r["git_dirty"] for r in rows) else ""
    if not gpus:
        return f"No run opened a GPU (runs {when}, {at}{dirty})."
    return f"Measured on {' and '.join(gpus)} {when}, {at}{dirty}."


def _day(value: Any) -> str | None:
    """The date of a started_at value: PostgreSQL gives a datetime, SQLite its text."""
    if value is None:
        return None
    return value.date().isoformat() if hasattr(value, "date") else str(value)[:10]


def runs_note(shown: Sequence[dict[str, Any]], experiment: str, stored: Sequence[dict[str, Any]] = ()) -> str:
    """How many runs the figure shows, and how many of the stored ones it leaves out by status."""
    shown_ids = {r["run_id"] for r in shown}
    left_out = {r["run_id"]: r["status"] if r["status"] != "ok" else "ok without a time or floors"
                for r in stored if r["run_id"] not in shown_ids}
    statuses = sorted(set(left_out.values()))
    why = "; left out: " + ", ".join(f"{list(left_out.values()).count(st)} {st}" for st in statuses) \
        if left_out else ""
    return f"{len(shown_ids)} runs of experiment {experiment}, the latest measurement of each setting{why}."


# -- drawing helpers -----------------------------------------------------------------------------------
def _matplotlib() -> tuple[type, type]:
    """matplotlib's Figure and Agg canvas classes, or one line saying how to install them."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConvsweepError("figures need matplotlib, which `pip install -e .` installs") from None
    return Figure, FigureCanvasAgg


def new_figure(rows: int, cols: int, width_in: float, height_in: float, **subplots: Any):
    """A Figure on the Agg canvas with constrained layout, and its axes as a rows x cols array."""
    figure_class, canvas_class = _matplotlib()
    fig = figure_class(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    canvas_class(fig)
    return fig, fig.subplots(rows, cols, squeeze=False, **subplots)


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


def _figure_width(panels: int) -> float:
    return PANEL_WIDTH_IN * panels + LEGEND_WIDTH_IN


# -- op time ---------------------------------------------------------------------------------------------
def op_time_figure(url: str | None, experiment: str, ceilings: Ceilings | None = None):
    """Each conv layer's op time against batch, one line per variant, both axes log."""
    stored = layer_rows(url, experiment)
    rows = timed_layers(stored, experiment)
    best, several = fastest(rows, ("layer_index", "series", "batch"))
    layers = conv_layers(best.values())
    batches = sorted({r["batch"] for r in best.values()})
    styles = series_styles(rows)
    fig, axes = new_figure(1, len(layers), _figure_width(len(layers)), PANEL_HEIGHT_IN + 1.2)
    for ax, (index, layer) in zip(axes[0], layers):
        for series, style in styles.items():
            points = sorted((b, r["op_time_ms"]) for (i, v, b), r in best.items() if i == index and v == series)
            if points:
                ax.plot(*zip(*points), marker="o", markersize=7, linestyle=style.linestyle, label=series,
                        **style.marker_colors())
        batch_axis(ax, batches)
        plain_log(ax, "y")
        ax.set_ylabel("op time (ms, log scale)")
        ax.set_title(f"{layer} (op time {index + 1})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    panel_legend(fig, axes[0], title="variant")
    note = ("Op time: the GPU time of the layer's kernels (nsys, else CUDA events), median over the timed passes."
            + (" Where a variant and batch have several runs (tunable settings, streams, host memory), the fastest "
               "is shown." if several else ""))
    return finish(fig, f"Op time per variant and batch: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment, stored)} {note}")


# -- speedup ---------------------------------------------------------------------------------------------
def speedup_figure(url: str | None, experiment: str, ceilings: Ceilings | None = None):
    """Each variant's speedup over the naive baseline per conv layer and batch, as bars up (faster)
    or down (slower) from 1× on a log axis."""
    stored = layer_rows(url, experiment)
    rows = timed_layers(stored, experiment)
    best, several = fastest(rows, ("layer_index", "series", "batch"))
    baseline = {(i, r["cache"], b): r["op_time_ms"] for (i, _, b), r in best.items()
                if r["variant"] == BASELINE_VARIANT}
    if not baseline:
        raise MissingData(f"experiment {experiment!r} has no ok {BASELINE_VARIANT} run: the speedup is over the "
                          f"{BASELINE_VARIANT} baseline; add {BASELINE_VARIANT} to its variants")
    styles = series_styles(rows)
    others = sorted({r["series"] for r in rows if r["variant"] != BASELINE_VARIANT})
    if not others:
        raise MissingData(f"experiment {experiment!r} has only {BASELINE_VARIANT} runs: no speedup to show")
    speedups = {(i, v, b): baseline[i, r["cache"], b] / r["op_time_ms"] for (i, v, b), r in best.items()
                if r["variant"] != BASELINE_VARIANT and (i, r["cache"], b) in baseline}
    layers = conv_layers(best.values())
    batches = sorted({b for *_, b in baseline})
    fig, axes = new_figure(1, len(layers), _figure_width(len(layers)), PANEL_HEIGHT_IN + 1.4, sharey=True)
    for ax, (index, layer) in zip(axes[0], layers):
        _speedup_bars(ax, speedups, index, batches, others, styles)
        ax.set_title(f"{layer} (op time {index + 1})", fontsize=10)
    axes[0][0].set_ylabel(f"speedup over {BASELINE_VARIANT} (×, log scale)")
    panel_legend(fig, axes[0], title="variant")
    unmatched = sorted({b for (_, _, b) in best if b not in batches})
    note = (f"Speedup: the {BASELINE_VARIANT} variant's op time over the variant's, same layer, batch and L2 state; "
            "bars above 1× are faster, below slower."
            + (f" Batches without a {BASELINE_VARIANT} run are left out: {', '.join(map(str, unmatched))}."
               if unmatched else "")
            + (" Where a variant and batch have several runs, the fastest of each is compared." if several else ""))
    return finish(fig, f"Speedup over {BASELINE_VARIANT} per variant and batch: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment, stored)} {note}")


def _speedup_bars(ax, speedups: dict[tuple, float], index: int, batches: list[int], series: list[str],
                  styles: dict[str, SeriesStyle]) -> None:
    """Grouped bars from 1×, one group per batch, each labelled with its value (upright when a
    group holds too many bars for the labels to fit side by side)."""
    width = 0.8 / len(series)
    for k, name in enumerate(series):
        xs = [x for x, b in enumerate(batches) if (index, name, b) in speedups]
        values = [speedups[index, name, batches[x]] for x in xs]
        if not xs:
            continue
        bars = ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], [v - 1 for v in values], width=width * 0.9,
                      bottom=1, color=styles[name].color, hatch=styles[name].hatch, edgecolor="white", label=name)
        ax.bar_label(bars, labels=[f"{v:.3g}×" for v in values], fontsize=7, padding=2,
                     rotation=90 if len(series) > 3 else 0)
    ax.axhline(1, color="0.3", linewidth=0.8)
    plain_log(ax, "y")
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("batch (images)")
    ax.margins(y=0.15)
    ax.grid(True, axis="y", which="both", alpha=0.3)


# -- roofline --------------------------------------------------------------------------------------------
def roofline_figure(url: str | None, experiment: str, ceilings: Ceilings | None = None):
    """Achieved GFLOP/s against arithmetic intensity per conv layer, one point per variant and
    batch, under the bench file's copy-bandwidth and matmul ceilings when one is given."""
    stored = layer_rows(url, experiment)
    rows = [r for r in timed_layers(stored, experiment) if r["flops"] and roofline_bytes(r)[0]]
    if not rows:
        raise MissingData(f"experiment {experiment!r} stores no flops and bytes floors for its conv layers")
    best, several = fastest(rows, ("layer_index", "series", "batch"))
    layers = conv_layers(best.values())
    styles = series_styles(rows)
    batches = sorted({r["batch"] for r in best.values()})
    markers = {b: BATCH_MARKERS[i % len(BATCH_MARKERS)] for i, b in enumerate(batches)}
    sources = sorted({roofline_bytes(r)[1] for r in best.values()})
    fig, axes = new_figure(1, len(layers), _figure_width(len(layers)), PANEL_HEIGHT_IN + 1.6,
                           sharex=True, sharey=True)
    for ax, (index, layer) in zip(axes[0], layers):
        for (i, variant, batch), row in sorted(best.items()):
            if i == index:
                _roofline_point(ax, row, markers[batch], batches.index(batch), styles[variant])
        ax.set_title(f"{layer} (op time {index + 1})", fontsize=10)
        ax.set_xlabel(f"arithmetic intensity (FLOP/byte, {' or '.join(sources)})")
        plain_log(ax, "x")
        plain_log(ax, "y")
        ax.margins(x=0.4)  # points of one layer share an intensity: room around them (ceilings widen it)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("achieved GFLOP/s (log scale)")
    roof_handles = _draw_ceilings(axes[0], ceilings, best.values()) if ceilings else []
    _roofline_legend(fig, styles, markers, roof_handles)
    meanings = "; ".join(NCU_BYTES_MEANING if source == NCU_BYTES else FLOOR_BYTES_MEANING for source in sources)
    if len(sources) > 1:
        meanings += "; a black rim marks a point over DRAM bytes"
    note = (f"Intensity: the layer's FLOPs over its {' or '.join(sources)} ({meanings}). "
            + _ceilings_note(ceilings, rows)
            + (" Where a variant and batch have several runs, the fastest is shown." if several else ""))
    return finish(fig, f"Roofline per conv layer: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment, stored)} {note}")


def _roofline_point(ax, row: dict[str, Any], marker: str, place: int, style: SeriesStyle) -> None:
    """One variant at one batch; larger batches get smaller markers drawn on top, so points that
    coincide (as a batch's times often scale with it) still show each one's rim."""
    nbytes, source = roofline_bytes(row)
    colors = style.marker_colors()
    if source == NCU_BYTES:  # a black rim: the intensity divides by measured DRAM traffic, not the floor
        colors["markeredgecolor"] = "black"
    ax.plot(row["flops"] / nbytes, row["flops"] / (row["op_time_ms"] * 1e6), ls="", marker=marker,
            markersize=max(8.0, 13.0 - 2.5 * place), markeredgewidth=2.0 if source == NCU_BYTES else 1.0,
            zorder=3 + place, **colors)


def _draw_ceilings(axes, ceilings: Ceilings, rows: Iterable[dict[str, Any]]) -> list:
    """The memory roof (copy GB/s x intensity) and one flat roof per matmul rate, over an
    intensity range that holds the points and every ridge."""
    intensities = [r["flops"] / roofline_bytes(r)[0] for r in rows]
    peaks_gflops = {mode: tflops * 1e3 for mode, tflops in sorted(ceilings.matmul_tflops.items(),
                                                                  key=lambda item: item[1])}
    ridges = [gflops / ceilings.copy_gbps for gflops in peaks_gflops.values()]
    lo, hi = min(intensities + ridges) / 4, max(intensities + ridges) * 4
    roof_end = min(hi, max(ridges, default=hi))  # the memory roof rises until the highest compute roof
    handles = []
    for ax in axes:
        handles = ax.plot([lo, roof_end], [ceilings.copy_gbps * lo, ceilings.copy_gbps * roof_end], color="0.15",
                          linewidth=1.5, label=f"device copy {ceilings.copy_gbps:.0f} GB/s")
        for k, (mode, gflops) in enumerate(peaks_gflops.items()):
            handles += ax.plot([gflops / ceilings.copy_gbps, hi], [gflops, gflops], color="0.15",
                               linestyle=VARIANT_LINESTYLES[(k + 1) % len(VARIANT_LINESTYLES)], linewidth=1.2,
                               label=f"{mode} matmul {gflops / 1e3:.1f} TFLOP/s")
        ax.set_xlim(lo, hi)
    return handles


def _roofline_legend(fig, styles: dict[str, SeriesStyle], markers: dict[int, str], roof_handles: list) -> None:
    """One legend at the side: variants by color, batches by marker, then the ceilings."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", markersize=8, **style.marker_colors()) for style in styles.values()]
    handles += [Line2D([], [], ls="", marker=m, markersize=8, color="0.4") for m in markers.values()]
    labels = list(styles) + [f"batch {b}" for b in markers]
    side_legend(fig, handles + roof_handles, labels + [h.get_label() for h in roof_handles],
                title="variant, batch, ceiling")


def _ceilings_note(ceilings: Ceilings | None, rows: Sequence[dict[str, Any]]) -> str:
    if ceilings is None:
        return ("No ceilings drawn: give --bench FILE (the JSON of `convsweep bench --json FILE`) for the device's "
                "measured copy bandwidth and matmul rates.")
    gpus = {r["gpu"] for r in rows}
    elsewhere = (f" The bench ran on {ceilings.device}, not on the GPU of these runs."
                 if ceilings.device and gpus and ceilings.device not in gpus else "")
    matmul = "" if ceilings.matmul_tflops else \
        " It holds no matmul rates (PyTorch was not installed), so no compute roof."
    return (f"Ceilings measured by convsweep bench ({ceilings.source}): device-to-device copy (read + write) and "
            f"matmul rates.{matmul}{elsewhere}")


# -- streams ---------------------------------------------------------------------------------------------
def stream_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    return _rows(url, f"""
        SELECT r.id AS run_id, r.variant, r.batch, r.streams, r.host_memory, r.forward_ms, r.overlap,
               {PROVENANCE_COLUMNS}
        FROM latest_run r
        JOIN environment e ON e.id = r.environment_id
        WHERE r.experiment = :experiment AND r.status = 'ok' AND r.forward_ms IS NOT NULL
        ORDER BY r.variant, r.batch, r.host_memory, r.streams, r.id""", {"experiment": experiment})


def streams_figure(url: str | None, experiment: str, ceilings: Ceilings | None = None):
    """Forward time and copy/kernel overlap against stream count, one panel column per batch and
    one line per variant and host-memory kind."""
    rows = stream_rows(url, experiment)
    best, several = fastest(rows, ("variant", "batch", "host_memory", "streams"), time="forward_ms")
    counts = {}
    for variant, batch, memory, streams in best:
        counts.setdefault((variant, batch, memory), set()).add(streams)
    if not any(len(s) > 1 for s in counts.values()):
        raise MissingData(f"experiment {experiment!r} has no ok runs at several stream counts "
                          "(sweeps/streams.yaml measures 1/2/4/8)")
    # A column per batch measured at several stream counts: one point per line says nothing here.
    batches = sorted({b for (_, b, _), streams in counts.items() if len(streams) > 1})
    memories = sorted({m for _, _, m in counts}, key=_memory_order)
    variants = sorted({v for v, _, _ in counts})
    fig, axes = new_figure(2, len(batches), _figure_width(len(batches)), 2 * PANEL_HEIGHT_IN + 1.0, sharex=True)
    for col, batch in enumerate(batches):
        for (variant, b, memory), streams in counts.items():
            if b == batch:
                k = variants.index(variant)
                style = {"color": f"C{memories.index(memory) % 10}", "marker": BATCH_MARKERS[k % len(BATCH_MARKERS)],
                         "linestyle": VARIANT_LINESTYLES[k % len(VARIANT_LINESTYLES)]}
                _stream_lines(axes[:, col], best, (variant, batch, memory), sorted(streams), style)
        _stream_axes(axes[:, col], batch, sorted({s for *_, s in best}))
    axes[0][0].set_ylabel("forward time (ms, log scale)")
    axes[1][0].set_ylabel("copy time hidden under kernels (%)")
    panel_legend(fig, axes.flat, title="variant, host memory")
    note = ("Forward: first host-to-device copy start to last device-to-host copy end, median over the timed passes. "
            "Overlap: the share of copy time hidden under kernels (nsys; none without it)."
            + (" Where a cell has several runs (tunable settings, chunk sizes), the fastest is shown."
               if several else ""))
    return finish(fig, f"Forward time and overlap against streams: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


def _memory_order(memory: str) -> tuple[int, str]:
    order = ("pageable", "pinned", "registered")
    return (order.index(memory) if memory in order else len(order), memory)


def _stream_lines(axes, best: dict[tuple, dict[str, Any]], cell: tuple, streams: list[int],
                  style: dict[str, str]) -> None:
    """One cell's forward time (top) and overlap in % (bottom) against its stream counts; color
    says the host memory, marker and line the variant, so lines that coincide stay told apart."""
    runs = [best[(*cell, s)] for s in streams]
    label = f"{cell[0]}, {cell[2]}"
    axes[0].plot(streams, [r["forward_ms"] for r in runs], label=label, alpha=0.85, **style)
    overlap = [(s, 100 * r["overlap"]) for s, r in zip(streams, runs) if r["overlap"] is not None]
    if overlap:
        axes[1].plot(*zip(*overlap), label=label, alpha=0.85, **style)


def _stream_axes(axes, batch: int, streams: list[int]) -> None:
    axes[0].set_title(f"batch {batch}", fontsize=10)
    plain_log(axes[0], "y")
    axes[1].set_ylim(-5, 105)
    if not axes[1].lines:
        axes[1].text(0.5, 0.5, "no overlap measured (timed without nsys)", ha="center", va="center",
                     transform=axes[1].transAxes, color="0.4")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(s) for s in streams])
        ax.set_xticks([], minor=True)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].set_xlabel("CUDA streams")


# -- phases ----------------------------------------------------------------------------------------------
def phase_rows(url: str | None, experiment: str) -> list[dict[str, Any]]:
    """Every run's phases, failed runs too (unlike the phases query): a job's settings share its
    wall time, so its bar adds up only with every one of them."""
    return _rows(url, f"""
        SELECT r.id AS run_id, r.job_id, r.variant, r.batch, r.streams, r.host_memory, r.cache, r.total_s,
               p.name AS phase, p.seconds, {PROVENANCE_COLUMNS}
        FROM latest_run r
        JOIN environment e ON e.id = r.environment_id
        LEFT JOIN phase p ON p.run_id = r.id
        WHERE r.experiment = :experiment
        ORDER BY r.variant, r.batch, r.streams, r.host_memory, r.id""", {"experiment": experiment})


def job_phases(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per job: its label, how many settings it measured, seconds per phase and its wall time, its
    settings' shares added up (a job splits what they shared among them, so they add up to it)."""
    jobs: dict[str, dict[str, Any]] = {}
    counted: set[int] = set()
    for row in rows:
        cold = " cold L2" if row["cache"] == "cold" else ""
        job = jobs.setdefault(row["job_id"], {"label": f"{row['variant']} b{row['batch']} s{row['streams']} "
                                                       f"{row['host_memory']}{cold}", "runs": set(), "phases": {},
                                              "total_s": 0.0})
        job["runs"].add(row["run_id"])
        if row["run_id"] not in counted:
            counted.add(row["run_id"])
            job["total_s"] += row["total_s"] or 0.0
        if row["phase"] is not None and row["seconds"]:
            job["phases"][row["phase"]] = job["phases"].get(row["phase"], 0.0) + row["seconds"]
    return jobs


def phases_figure(url: str | None, experiment: str, ceilings: Ceilings | None = None):
    """Each job's wall time as a stacked bar of its phases (start, load, compile, ..., nsys)."""
    rows = phase_rows(url, experiment)
    jobs = job_phases(rows)
    if not any(job["phases"] for job in jobs.values()):
        raise MissingData(f"experiment {experiment!r} has no run with stored phases")
    names = [p for p in PHASE_ORDER if any(p in j["phases"] for j in jobs.values())]
    names += sorted({p for j in jobs.values() for p in j["phases"]} - set(names))
    labels = _job_labels(jobs)
    height_in = max(PANEL_HEIGHT_IN + 1.2, 2.2 + 0.32 * len(jobs))
    fig, axes = new_figure(1, 1, PANEL_WIDTH_IN * 1.6 + LEGEND_WIDTH_IN, height_in)
    ax = axes[0][0]
    _phase_bars(ax, jobs, labels, names)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("job (variant, batch, streams, host memory)")
    ax.invert_yaxis()
    ax.margins(y=0.01)
    ax.grid(True, axis="x", alpha=0.3)
    side_legend(fig, *ax.get_legend_handles_labels(), title="phase")
    note = ("Phases as each job recorded them; a job of several settings shares its start, load, compile and "
            "nsys time among them, and its bar adds them up. "
            f"'{UNACCOUNTED_PHASE}': wall time that no recorded phase covers.")
    return finish(fig, f"Where each job's wall time went: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


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


def _phase_bars(ax, jobs: dict[str, dict[str, Any]], labels: dict[str, str], names: list[str]) -> None:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    ids = list(jobs)
    left = [0.0] * len(ids)
    for k, name in enumerate([*names, UNACCOUNTED_PHASE]):
        if name == UNACCOUNTED_PHASE:
            widths = [max(0.0, jobs[j]["total_s"] - sum(jobs[j]["phases"].values())) for j in ids]
            color = "0.85"
        else:
            widths = [jobs[j]["phases"].get(name, 0.0) for j in ids]
            color = palette(2 * k % 20 + 2 * k // 20 % 2)  # the dark shades first, then the light ones
        if any(widths):
            ax.barh(range(len(ids)), widths, left=left, color=color, label=PHASE_LABELS.get(name, name),
                    edgecolor="white", linewidth=0.5)
            left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(ids)), [labels[j] for j in ids], fontsize=8)


# -- tuning landscape ------------------------------------------------------------------------------------
def tuning_settings(rows: Iterable[dict[str, Any]]) -> dict[tuple[int, str, int], dict[str, dict[str, Any]]]:
    """Per (layer_index, layer, batch): each setting (the layer's variant and tunables) with its
    fastest ok op time, or None and the status when it has no ok run."""
    panels: dict[tuple[int, str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        settings = panels.setdefault((row["layer_index"], row["layer"], row["batch"]), {})
        variant = row["layer_variant"] or row["variant"]
        tunables = setting_text(variant, row["params"])
        entry = settings.setdefault(tunables + cache_suffix(row["cache"]),
                                    {"variant": variant, "tunables": tunables, "params": row["params"] or {},
                                     "cache": row["cache"], "op_time_ms": None, "status": row["status"]})
        if row["status"] == "ok" and row["op_time_ms"]:
            if entry["op_time_ms"] is None or row["op_time_ms"] < entry["op_time_ms"]:
                entry.update(op_time_ms=row["op_time_ms"], status="ok")
    return panels


def _is_grid(settings: dict[str, dict[str, Any]]) -> bool:
    """Whether one variant ran at more than one tunable setting here (a cold L2 run of the same
    setting is not another setting)."""
    tunables = {(s["variant"], s["tunables"]) for s in settings.values()}
    return len(tunables) > len({s["variant"] for s in settings.values()})


def tuning_figure(url: str | None, experiment: str, ceilings: Ceilings | None = None):
    """Every tunable setting's op time per conv layer and batch, ranked from the fastest, incorrect
    and failed settings counted beside."""
    rows = layer_rows(url, experiment)
    panels = {k: v for k, v in tuning_settings(rows).items() if _is_grid(v)}
    if not panels:
        raise MissingData(f"experiment {experiment!r} has no tunable grid: every variant ran at one setting "
                          "(sweeps/tuning.yaml sweeps some)")
    layers = sorted({(i, layer) for i, layer, _ in panels})
    batches = sorted({b for *_, b in panels})
    every = [s for settings in panels.values() for s in settings.values()]
    colors = variant_colors(s["variant"] for s in every)
    names = tunable_names(every)
    most = max(len(s) for s in panels.values())
    labelled = most <= LABELLED_SETTINGS_MAX
    height = (1.2 + 0.22 * most) if labelled else PANEL_HEIGHT_IN
    fig, axes = new_figure(len(layers), len(batches), (PANEL_WIDTH_IN + (1.0 if labelled else 0)) * len(batches)
                           + LEGEND_WIDTH_IN, height * len(layers) + 1.4)
    for row, (index, layer) in enumerate(layers):
        for col, batch in enumerate(batches):
            settings = panels.get((index, layer, batch))
            _tuning_panel(axes[row][col], settings, colors, names, labelled)
            axes[row][col].set_title(f"{layer}, batch {batch}" + _unranked_note(settings or {}), fontsize=10)
    _tuning_legend(fig, colors, names)
    note = ("Each setting's op time (the fastest of its ok runs), ranked from the fastest; settings that were "
            "incorrect or failed have no time and are counted in each panel's title. A setting is named by "
            "its values, in the order its variant's tunables have in the legend.")
    return finish(fig, f"Tuning landscape: op time per setting: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


def tunable_names(settings: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """variant -> the names of its tunables, in the order its settings first have them."""
    names: dict[str, dict[str, None]] = {}
    for s in settings:
        names.setdefault(s["variant"], {}).update(dict.fromkeys(s["params"]))
    return {variant: list(keys) for variant, keys in names.items()}


def values_text(params: dict[str, Any], names: list[str]) -> str:
    """A setting as its values in its variant's tunable order ('4, 256, 8'), so a panel of settings
    reads as a table whose header is the legend; 'BLOCK=64' where the setting lacks one of the
    names (a partial setting), '(defaults)' where it has none. The legend's order holds however the
    database ordered a setting's keys (PostgreSQL's JSONB sorts them its own way)."""
    if not params:
        return "(defaults)"
    if set(params) == set(names):
        return ", ".join(str(params[k]) for k in names)
    return params_text(params)


def _tuning_panel(ax, settings: dict[str, dict[str, Any]] | None, colors: dict[str, str],
                  names: dict[str, list[str]], labelled: bool) -> None:
    """One layer and batch: a ranked dot per ok setting (its values on the axis when few, else the
    fastest named in the corner), op time on a log axis."""
    if not settings:
        ax.text(0.5, 0.5, "no grid measured here", ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.set_axis_off()
        return
    ranked = sorted(((s["op_time_ms"], values_text(s["params"], names[s["variant"]]) + cache_suffix(s["cache"]),
                      s["variant"], name) for name, s in settings.items() if s["op_time_ms"]))
    ranks = list(range(1, len(ranked) + 1))
    ax.plot([t for t, *_ in ranked], ranks, color="0.8", linewidth=1, zorder=1)
    ax.scatter([t for t, *_ in ranked], ranks, c=[colors[v] for _, _, v, _ in ranked], s=22, zorder=3)
    plain_log(ax, "x")
    ax.set_xlabel("op time (ms, log scale)")
    ax.set_ylim(len(ranked) + 0.5, 0.5)
    ax.grid(True, which="both", alpha=0.3)
    if labelled:
        ax.set_yticks(ranks, [label for _, label, _, _ in ranked], fontsize=7)
    elif ranked:
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("rank (1 = fastest)")
        ax.text(0.98, 0.97, "fastest: " + ranked[0][3].replace(" ", "\n", 1), ha="right", va="top",
                transform=ax.transAxes, fontsize=7)


def _unranked_note(settings: dict[str, dict[str, Any]]) -> str:
    """'; not ranked: 1 failed, 1 incorrect' for a panel's title, or nothing when every setting has a time."""
    unranked = [s["status"] for s in settings.values() if not s["op_time_ms"]]
    return "; not ranked: " + ", ".join(f"{unranked.count(st)} {st}" for st in sorted(set(unranked))) \
        if unranked else ""


def _tuning_legend(fig, colors: dict[str, str], names: dict[str, list[str]]) -> None:
    """Each variant's colour, and the order of its tunables in the settings' names."""
    from matplotlib.lines import Line2D

    labels = [textwrap.fill(f"{variant}: {', '.join(names[variant]) or 'no tunables'}", 30,
                            subsequent_indent="  ", break_on_hyphens=False) for variant in colors]
    side_legend(fig, [Line2D([], [], ls="", marker="o", color=c) for c in colors.values()], labels,
                title="variant: its tunables")


# -- the command -----------------------------------------------------------------------------------------
FIGURES: dict[str, Callable[..., Any]] = {
    "op-time": op_time_figure,
    "speedup": speedup_figure,
    "roofline": roofline_figure,
    "streams": streams_figure,
    "phases": phases_figure,
    "tuning": tuning_figure,
}


def figure(kind: str, experiment: str, url: str | None = None, ceilings: Ceilings | None = None):
    """One figure of one experiment, not yet saved: a matplotlib Figure; MissingData when the
    database lacks what it needs."""
    if kind not in FIGURES:
        raise ConvsweepError(f"unknown figure {kind!r}: expected one of {', '.join(KINDS)} or all")
    return FIGURES[kind](url, experiment, ceilings)


def plot(kind: str, url: str | None = None, experiment: str | None = None, out: str | Path | None = None,
         bench: str | Path | None = None) -> Plotted:
    """Draw `kind` (or all kinds) for `experiment` (or every stored one) and write PNGs to `out`
    (default results/<experiment>/figures, or results/figures for every experiment)."""
    kinds = KINDS if kind == "all" else (kind,)
    if kind != "all" and kind not in FIGURES:
        raise ConvsweepError(f"unknown figure {kind!r}: expected one of {', '.join(KINDS)} or all")
    _matplotlib()
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

    from . import query  # noqa: F401  loaded once, before the fork, not once per figure

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
    _save(fig, path)
    return path, None


def _experiments(url: str | None, experiment: str | None) -> list[str]:
    stored = experiments(url)
    if not stored:
        raise MissingData("the database holds no runs: run a sweep first")
    if experiment and experiment not in stored:
        raise MissingData(f"no runs of experiment {experiment!r} in the database (it holds {', '.join(stored)})")
    return [experiment] if experiment else stored


def _save(fig, path: Path) -> None:
    """Write the PNG through a temporary name, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    # zlib's fastest level: a quarter less time per figure than the default, and no larger files here
    fig.savefig(partial, format="png", pil_kwargs={"compress_level": 1})
    partial.replace(path)
