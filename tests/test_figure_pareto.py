"""The pareto figure from the database, on the CPU: a panel per conv layer and batch, every setting with an energy
per pass a point with its op time interval as an x error bar, the front ringed and drawn as a step line, a colour
per variant in the legend, a caption saying where it was measured and what was left out; one line of MissingData
when no run has energy; and `convsweep plot pareto` writing a PNG."""
from __future__ import annotations

import pytest

from convsweep.figures import FIGURES, figure, plot
from convsweep.figures.pareto import pareto_rows
from convsweep.analysis.reading import MissingData

from test_pareto import COMMIT, CONV1_SHARE, EXPERIMENT, FRONT, SETTINGS, known_results, setting, store

pytest.importorskip("matplotlib", minversion="3.8", reason="figures need matplotlib (a dependency of convsweep)")

GPU = "NVIDIA H100 80GB HBM3"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def caption(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts).replace("\n", " ")


def panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def by_gid(ax, gid: str):
    (found,) = [line for line in ax.get_lines() if line.get_gid() == gid]
    return found


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return store(f"sqlite:///{tmp_path_factory.mktemp('pareto') / 'results.sqlite'}", known_results())


def test_pareto_is_registered_and_says_what_it_shows():
    assert FIGURES["pareto"].rows is pareto_rows
    assert FIGURES["pareto"].description == ("Each setting's op time against its energy per pass, per conv layer and "
                                             "batch, with the front of the settings no other beats on both drawn as "
                                             "a step line.")


def test_each_layer_and_batch_is_a_panel_of_its_settings_with_the_front_stepped_and_ringed(url):
    fig = figure("pareto", EXPERIMENT, url)
    drawn = panels(fig)
    # batch 1000 has one setting alone: a front among one says nothing, and the caption says it is left out
    assert list(drawn) == ["conv1, batch 100: 3 of 5 on the front", "conv2, batch 100: 3 of 5 on the front"]
    assert "2 conv layer and batch with one setting alone left out" in caption(fig)
    ax = drawn["conv1, batch 100: 3 of 5 on the front"]
    points = {}
    for bars in ax.containers:  # one errorbar per variant: its point, and its op time interval across
        (x,), (y,) = bars.lines[0].get_xdata(), bars.lines[0].get_ydata()
        ((low, _), (high, _)), = bars.lines[2][0].get_segments()
        assert low < x < high and high / low < 1.02
        points[bars.get_label()] = (x, y)
    assert set(points) == set(SETTINGS) - {"unmetered"}  # no energy: no point
    for variant, (x, y) in points.items():
        time, joules = SETTINGS[variant]
        assert x == pytest.approx(CONV1_SHARE * time, rel=0.01) and y == joules

    ringed = by_gid(ax, "front-points")
    assert list(ringed.get_xdata()) == [points[v][0] for v in FRONT]
    assert list(ringed.get_ydata()) == [SETTINGS[v][1] for v in FRONT]
    assert ringed.get_markerfacecolor() == "none"
    step = by_gid(ax, "front")
    assert step.get_drawstyle() == "steps-post" and list(step.get_xdata()) == list(ringed.get_xdata())
    assert ax.get_xlabel() == "op time (ms)" and ax.get_ylabel() == "energy per pass (J)"  # within a decade: linear
    colors = {bars.get_label(): bars.lines[0].get_color() for bars in ax.containers}
    assert len(set(colors.values())) == len(colors)  # a colour per variant

    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [*sorted(points), "the front"]
    assert fig.get_suptitle() == f"Op time against energy per pass: {EXPERIMENT}"
    text = caption(fig)
    assert f"Measured on {GPU} on 2026-11-22, at commit {COMMIT[:10]}" in text
    assert "5 settings of experiment lenet86-baseline with an energy per pass" in text and "in 2 panels" in text
    assert "95% bootstrap interval" in text and "suspect, incorrect and failed ones are never drawn" in text
    assert "1 ok setting without an energy per pass left out" in text


def test_fronts_of_other_cells_get_panels_of_their_own(tmp_path):
    """And op times a decade or more apart are drawn on a log axis."""
    url = store(f"sqlite:///{tmp_path / 'r.sqlite'}", [setting("naive", 40.0, 9.0, 1), setting("tiled", 2.0, 6.0, 2),
                                                       setting("naive", 40.0, 9.0, 3, streams=2)])
    fig = figure("pareto", EXPERIMENT, url)
    drawn = panels(fig)
    assert list(drawn) == [f"{layer}, batch 100, s1 pageable: 1 of 2 on the front" for layer in ("conv1", "conv2")]
    one = drawn["conv1, batch 100, s1 pageable: 1 of 2 on the front"]
    assert one.get_xscale() == "log" and one.get_xlabel() == "op time (ms, log scale)" and one.get_yscale() == "linear"
    assert "2 conv layer and batch with one setting alone left out" in caption(fig)  # s2's, one setting each


def test_many_panels_wrap_four_a_row(tmp_path):
    results = [setting(variant, time, joules, seed, batch=batch)
               for batch in (100, 200, 300) for seed, (variant, time, joules) in
               enumerate([("naive", 40.0, 9.0), ("tiled", 2.0, 6.0)], start=batch)]
    fig = figure("pareto", EXPERIMENT, store(f"sqlite:///{tmp_path / 'r.sqlite'}", results))
    shown = [ax for ax in fig.axes if ax.get_title()]
    assert len(shown) == 6 and len({round(ax.get_position().y0, 3) for ax in shown}) == 2  # 4 then 2
    assert fig.get_size_inches()[0] < 25


def test_no_energy_is_one_line_of_missing_data(tmp_path):
    url = store(f"sqlite:///{tmp_path / 'r.sqlite'}", [setting("naive", 40.0, None, 1),
                                                       setting("tiled", 20.0, 6.0, 2, status="suspect")])
    with pytest.raises(MissingData, match=r"^experiment 'lenet86-baseline' has no ok run with an energy per pass: "
                                          r"a sweep with energy_window_s 0 measures none") as caught:
        figure("pareto", EXPERIMENT, url)
    assert "\n" not in str(caught.value)


def test_plot_pareto_writes_a_png(url, tmp_path):
    done = plot("pareto", url=url, experiment=EXPERIMENT, out=tmp_path)
    assert done.paths == [tmp_path / "pareto.png"]
    assert done.paths[0].read_bytes().startswith(PNG_MAGIC)
