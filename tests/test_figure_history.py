"""The history figure from the database, on the CPU: a panel per job with two ok measurements or more, its points
in commit order with their intervals as error bars, suspect runs hollow, each step a vertical line labelled with its
commit, the commits' short hashes on the x axis; one line of MissingData when no job was measured twice; and
`convsweep plot history` writing a PNG."""
from __future__ import annotations

import pytest

from convsweep.figures import FIGURES, figure, plot
from convsweep.figures.history import history_rows
from convsweep.analysis.reading import MissingData

from test_history import commit, measurement, series, store

pytest.importorskip("matplotlib", minversion="3.8", reason="figures need matplotlib (a dependency of convsweep)")

EXPERIMENT = "lenet86-baseline"
GPU = "NVIDIA H100 80GB HBM3"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TILED = series([20.0] * 6 + [24.0] * 6, seed=21)  # slower from commit 6
NAIVE = series([40.0] * 12, seed=22)


def caption(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts).replace("\n", " ")


def panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def step_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid() == "step"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    results = []
    for i, (tiled, naive) in enumerate(zip(TILED, NAIVE)):
        results += [measurement("tiled", i, tiled, seed=i), measurement("naive", i, naive, seed=100 + i)]
    results += [measurement("tiled", 12, 30.0, seed=300, status="suspect"),  # drawn hollow, never a step
                measurement("tiled", 13, 31.0, seed=301, status="incorrect"),  # not drawn
                measurement("im2col", 0, 30.0, seed=400)]  # measured once: no history to draw
    return store(f"sqlite:///{tmp_path_factory.mktemp('history') / 'results.sqlite'}", results)


def test_history_is_registered_and_says_what_it_shows():
    assert FIGURES["history"].rows is history_rows
    assert FIGURES["history"].description.startswith("Each job's Op Time across its measurements in commit order")


def test_each_job_is_a_panel_of_its_points_with_error_bars_and_its_steps_marked(url):
    fig = figure("history", EXPERIMENT, url)
    drawn = panels(fig)
    assert len(drawn) == 2  # im2col was measured once
    (tiled,) = [ax for title, ax in drawn.items() if title.startswith("tiled-")]
    (naive,) = [ax for title, ax in drawn.items() if title.startswith("naive-")]
    assert list(drawn.values())[0] is tiled  # a job with a step comes first

    (bars,) = tiled.containers
    line = bars.lines[0]
    assert list(line.get_ydata()) == pytest.approx(TILED, rel=0.01)
    assert list(line.get_xdata()) == list(range(12)) and line.get_linestyle() == "-"
    (error_bars,) = bars.lines[2]
    segments = error_bars.get_segments()
    assert len(segments) == 12
    assert all(low[1] < y < high[1] for (low, high), y in zip(segments, line.get_ydata()))

    (step,) = step_lines(tiled)
    assert list(step.get_xdata()) == [5.5, 5.5] and step.get_color() == "C3"  # between commit 5 and 6, slower
    labels = [t.get_text() for t in tiled.texts]
    assert any(commit(6)[:7] in text and "+20" in text for text in labels), labels
    assert step_lines(naive) == [] and list(naive.texts) == []

    (suspect,) = [ln for ln in tiled.get_lines() if ln.get_label() == "suspect"]
    assert list(suspect.get_xdata()) == [12] and suspect.get_markerfacecolor() == "white"
    assert [t.get_text() for t in tiled.get_xticklabels()] == [commit(i)[:7] for i in range(13)]

    assert fig.get_suptitle() == f"Op Time across commits per job: {EXPERIMENT}"
    assert {ax.get_ylabel() for ax in drawn.values()} >= {"Op Time (ms)"}
    text = caption(fig)
    assert f"Measured on {GPU} on 2026-11-01, at commits {commit(0)[:10]}" in text
    assert "2 jobs of experiment lenet86-baseline" in text and "1 step," in text
    assert "Hollow: suspect runs" in text and "95% bootstrap interval" in text


def test_a_dirty_tree_is_starred_and_a_job_measured_twice_at_one_commit_is_spread(tmp_path):
    levels = series([20.0] * 4, seed=23)
    results = [measurement("tiled", i, level, seed=i, dirty=(i == 3)) for i, level in enumerate(levels)]
    again = measurement("tiled", 1, 20.0, seed=9)
    again["started_at"] = "2026-11-01T10:30:00+00:00"  # commit 1 again, before commit 2
    fig = figure("history", EXPERIMENT, store(f"sqlite:///{tmp_path / 'r.sqlite'}", results + [again]))
    (ax,) = panels(fig).values()
    assert [t.get_text() for t in ax.get_xticklabels()] == [commit(0)[:7], commit(1)[:7], commit(2)[:7],
                                                            commit(3)[:7] + "*"]
    xs = list(ax.containers[0].lines[0].get_xdata())
    assert xs[0] == 0 and xs[3] == 2 and xs[4] == 3 and 0.5 < xs[1] < 1 < xs[2] < 1.5
    assert "(with uncommitted changes)" in caption(fig) and "* a dirty tree" in caption(fig)


def test_a_step_at_a_dirty_tree_is_labelled_with_its_star(tmp_path):
    """The step line names the commit as the x axis does: an uncommitted edit's step is `abc1234*`."""
    levels = series([20.0] * 3 + [24.0] * 3, seed=31)
    results = [measurement("tiled", i, level, seed=i, dirty=(i == 3)) for i, level in enumerate(levels)]
    fig = figure("history", EXPERIMENT, store(f"sqlite:///{tmp_path / 'r.sqlite'}", results))
    (ax,) = panels(fig).values()
    (label,) = [t.get_text() for t in ax.texts]
    assert label.split()[0] == commit(3)[:7] + "*" and label.split()[1].startswith("+"), label


def test_no_job_measured_twice_is_one_line_of_missing_data(tmp_path):
    url = store(f"sqlite:///{tmp_path / 'r.sqlite'}",
                [measurement("tiled", 0, 20.0, seed=1), measurement("naive", 0, 40.0, seed=2),
                 measurement("naive", 1, 40.0, seed=3, status="failed")])
    with pytest.raises(MissingData, match=r"^experiment 'lenet86-baseline' has no job with two ok measurements: "
                                          r"a history needs a job measured again") as caught:
        figure("history", EXPERIMENT, url)
    assert "\n" not in str(caught.value)


def test_plot_history_writes_a_png(url, tmp_path):
    done = plot("history", url=url, experiment=EXPERIMENT, out=tmp_path)
    assert done.paths == [tmp_path / "history.png"]
    assert done.paths[0].read_bytes().startswith(PNG_MAGIC)
