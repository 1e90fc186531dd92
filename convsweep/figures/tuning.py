"""The tuning figure: every tunable setting's op time per conv layer and batch, ranked."""
from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

from convsweep.analysis.reading import Ceilings, MissingData, provenance
from .drawing import (LEGEND_WIDTH_IN, MAX_COLUMNS, MAX_ROWS, PANEL_HEIGHT_IN, PANEL_WIDTH_IN, finish, new_figure,
                      picked_note, plain_log, runs_note, side_legend, spread, variant_colors)
from convsweep.base.axes import series_suffix

LABELLED_SETTINGS_MAX = 24  # a tuning panel names each setting up to this many, else ranks only


def draw(rows: list[dict[str, Any]], experiment: str, ceilings: Ceilings | None = None):
    """Every tunable setting's op time per conv layer and batch, ranked from the fastest, incorrect
    and failed settings counted beside."""
    panels = {k: v for k, v in tuning_settings(rows).items() if _is_grid(v)}
    if not panels:
        raise MissingData(f"experiment {experiment!r} has no tunable grid: every variant ran at one setting "
                          "(sweeps/tuning.yaml sweeps some)")
    if not any(s["op_time_ms"] for settings in panels.values() for s in settings.values()):
        raise MissingData(f"experiment {experiment!r} has a tunable grid, but no setting of it finished ok "
                          "(`convsweep query failures` says why)")
    every_layer, every_batch = sorted({(i, layer) for i, layer, _ in panels}), sorted({b for *_, b in panels})
    layers, batches = spread(every_layer, MAX_ROWS), spread(every_batch, MAX_COLUMNS)
    panels = {(i, layer, b): settings for (i, layer, b), settings in panels.items()
              if (i, layer) in layers and b in batches}
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
            _panel(axes[row][col], settings, colors, names, labelled)
            axes[row][col].set_title(f"{layer}, batch {batch}" + _unranked_note(settings or {}), fontsize=10)
    _legend(fig, colors, names)
    note = ("Each setting's op time (the fastest of its ok runs), ranked from the fastest; settings that were "
            "incorrect or failed have no time and are counted in each panel's title. A setting is named by "
            "its values, in the order its variant's tunables have in the legend."
            + picked_note(len(layers), len(every_layer), "conv layers with a grid")
            + picked_note(len(batches), len(every_batch), "batches with a grid"))
    return finish(fig, f"Tuning landscape: op time per setting: {experiment}",
                  f"{provenance(rows)} {runs_note(rows, experiment)} {note}")


def tuning_settings(rows: Iterable[dict[str, Any]]) -> dict[tuple[int, str, int], dict[str, dict[str, Any]]]:
    """Per (layer_index, layer, batch): each setting (the layer's variant and tunables, and what sets its
    series apart: ', cold L2') with its fastest ok op time, or None and the status when it has no ok run."""
    panels: dict[tuple[int, str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        settings = panels.setdefault((row["layer_index"], row["layer"], row["batch"]), {})
        variant = row["layer_variant"] or row["variant"]
        tunables, apart = setting_text(variant, row["params"]), series_suffix(row)
        entry = settings.setdefault(tunables + apart,
                                    {"variant": variant, "tunables": tunables, "params": row["params"] or {},
                                     "apart": apart, "op_time_ms": None, "status": row["status"]})
        if row["status"] == "ok" and row["op_time_ms"]:
            if entry["op_time_ms"] is None or row["op_time_ms"] < entry["op_time_ms"]:
                entry.update(op_time_ms=row["op_time_ms"], status="ok")
    return panels


def _is_grid(settings: dict[str, dict[str, Any]]) -> bool:
    """Whether one variant ran at more than one tunable setting here (a cold L2 run of the same
    setting is not another setting)."""
    tunables = {(s["variant"], s["tunables"]) for s in settings.values()}
    return len(tunables) > len({s["variant"] for s in settings.values()})


def setting_text(variant: str, params: dict[str, Any]) -> str:
    """'naive BLOCK=64' (tunables in the order the run stored them), or 'naive (defaults)' for a
    variant run at its registry defaults."""
    return f"{variant} " + (params_text(params) if params else "(defaults)")


def params_text(params: dict[str, Any]) -> str:
    """'BLOCK_M=4,BLOCK_N=256': tunables in the order the run stored them."""
    return ",".join(f"{k}={v}" for k, v in params.items())


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


def _panel(ax, settings: dict[str, dict[str, Any]] | None, colors: dict[str, str],
           names: dict[str, list[str]], labelled: bool) -> None:
    """One layer and batch: a ranked dot per ok setting (its values on the axis when few, else the
    fastest named in the corner), op time on a log axis."""
    if not settings:
        ax.text(0.5, 0.5, "no grid measured here", ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.set_axis_off()
        return
    ranked = sorted(((s["op_time_ms"], values_text(s["params"], names[s["variant"]]) + s["apart"],
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


def _legend(fig, colors: dict[str, str], names: dict[str, list[str]]) -> None:
    """Each variant's colour, and the order of its tunables in the settings' names."""
    from matplotlib.lines import Line2D

    labels = [textwrap.fill(f"{variant}: {', '.join(names[variant]) or 'no tunables'}", 30,
                            subsequent_indent="  ", break_on_hyphens=False) for variant in colors]
    side_legend(fig, [Line2D([], [], ls="", marker="o", color=c) for c in colors.values()], labels,
                title="variant: its tunables")
