"""Every job's history across commits and its steps (convsweep.analysis.history), on synthetic histories stored through the
real ingest: known steps up, down and two of them are found at their commit, pure noise and a slow drift under the
threshold give none, suspect, incorrect and failed runs never count; and `convsweep query regressions` lists the
steps read-only, in a table and as JSON, on SQLite and PostgreSQL."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from convsweep.app.cli import main as cli_main
from convsweep.base.errors import StoreError
from convsweep.analysis.history import MIN_SEGMENT, REGRESSION_COLUMNS, histories
from convsweep.analysis.query import list_queries
from convsweep.analysis.questions import COMPUTED, named_queries
from convsweep.analysis.questions import fetch_question as fetch, run_question as run_query
from convsweep.base.stats import FASTER, SLOWER
from convsweep.store import ingest_result, open_store

from store_fixtures import as_reader
from test_compare import stored as with_samples
from test_stats import noisy

START = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
SAMPLES = 10
WITHIN_RUN = 0.004  # a quiet GPU's pass-to-pass noise
BETWEEN_RUNS = 0.01  # and a run's median moving by about 1% from one run to the next


def commit(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def measurement(variant: str, i: int, op_time_ms: float, seed: int, status: str = "ok", dirty: bool = False,
                **kwargs) -> dict:
    """The i-th measurement of a job, at the i-th commit and hour, its samples around `op_time_ms`."""
    result = with_samples(variant, commit(i), noisy(op_time_ms, SAMPLES, WITHIN_RUN, seed), status=status,
                          started_at=(START + timedelta(hours=i)).isoformat(), **kwargs)
    result["git"]["dirty"] = dirty
    return result


def series(levels: list[float], seed: int) -> list[float]:
    """Each commit's true Op Time moved by the run-to-run noise."""
    return list(np.asarray(levels) * (1 + BETWEEN_RUNS * np.random.default_rng(seed).standard_normal(len(levels))))


def store(url: str, results: list[dict]) -> str:
    engine = open_store(url)
    for result in results:
        ingest_result(engine, result)
    engine.dispose()
    return url


def job(url: str, variant: str, **kwargs):
    (found,) = [h for h in histories(url, **kwargs) if h.cell["variant"] == variant]
    return found


def steps(url: str, variant: str) -> list[tuple[int, str, str]]:
    """(index of the first ok point after the step, its commit, verdict) of each step of the job."""
    return [(s.index, s.commit, s.verdict) for s in job(url, variant).steps]


# Known histories: (levels, steps as (index, verdict)).
HISTORIES = {
    "slower": ([20.0] * 8 + [24.0] * 8, [(8, SLOWER)]),
    "faster": ([24.0] * 8 + [20.0] * 8, [(8, FASTER)]),
    "two-steps": ([20.0] * 6 + [24.0] * 6 + [21.0] * 6, [(6, SLOWER), (12, FASTER)]),
    "noise": ([20.0] * 16, []),
    "drift": (list(np.linspace(20.0, 20.0 * 1.04, 16)), []),  # 4% in all, never 5% between neighbours
}


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'results.sqlite'}"
    results = []
    for k, (name, (levels, _)) in enumerate(HISTORIES.items()):
        for i, level in enumerate(series(levels, seed=100 + k)):
            results.append(measurement(name, i, level, seed=1000 * k + i))
    return store(url, results)


@pytest.mark.parametrize("name", list(HISTORIES))
def test_known_steps_are_found_at_their_commit_and_none_elsewhere(known, name):
    levels, expected = HISTORIES[name]
    history = job(known, name)
    assert len(history.points) == len(history.ok) == len(levels)
    assert [p.commit for p in history.points] == [commit(i) for i in range(len(levels))]
    assert steps(known, name) == [(index, commit(index), verdict) for index, verdict in expected]
    for step in history.steps:
        before, after = levels[step.index - 1], levels[step.index]
        assert step.ratio == pytest.approx(after / before, rel=0.03)
        assert step.low < step.ratio < step.high and (step.low > 1 or step.high < 1)
        assert step.before_ms == pytest.approx(before, rel=0.03) and step.after_ms == pytest.approx(after, rel=0.03)
        assert step.run_id == history.ok[step.index].run_id and step.dirty is False


def test_each_point_is_its_median_op_time_with_a_bootstrap_interval(known):
    history = job(known, "noise")
    for point in history.points:
        assert point.median_ms == pytest.approx(float(np.median(point.samples)))
        assert len(point.samples) == SAMPLES  # the conv layers added up, pass by pass
        assert point.low_ms < point.median_ms < point.high_ms
        assert point.high_ms / point.low_ms < 1 + 6 * WITHIN_RUN


def test_a_larger_threshold_drops_a_smaller_step(known):
    assert [s.verdict for s in job(known, "slower", threshold=0.25).steps] == []
    assert [s.verdict for s in job(known, "slower", threshold=0.1).steps] == [SLOWER]


def test_suspect_incorrect_and_failed_runs_are_never_counted(db_url):
    """A flat history with a suspect, an incorrect and a failed run at 30 ms in it: no step; the suspect one is a
    point of the history (the figure draws it hollow), the others are not."""
    levels = series([20.0] * 10, seed=7)
    results = [measurement("tiled", i, level, seed=i) for i, level in enumerate(levels)]
    results += [measurement("tiled", 4, 30.0, seed=40, status="suspect"),
                measurement("tiled", 5, 30.0, seed=50, status="incorrect"),
                measurement("tiled", 6, 30.0, seed=60, status="failed")]
    store(db_url, results)
    history = job(db_url, "tiled")
    assert [p.status for p in history.points].count("suspect") == 1 and len(history.points) == 11
    assert len(history.ok) == 10 and history.steps == []


def test_a_step_at_a_dirty_tree_says_so_and_points_follow_the_time_measured(db_url):
    """Stored out of order (ids say nothing of when): the history follows started_at."""
    levels = series([20.0] * 5 + [24.0] * 5, seed=8)
    results = [measurement("tiled", i, level, seed=i, dirty=(i == 5)) for i, level in enumerate(levels)]
    store(db_url, results[::-1])
    history = job(db_url, "tiled")
    assert [p.commit for p in history.points] == [commit(i) for i in range(10)]
    (step,) = history.steps
    assert (step.index, step.commit, step.dirty, step.verdict) == (5, commit(5), True, SLOWER)


def test_a_level_must_hold_on_both_sides(db_url):
    """One slow measurement is an outlier, not a step; and the newest commit alone is compare's to judge."""
    assert MIN_SEGMENT == 2
    spike = series([20.0] * 4 + [26.0] + [20.0] * 4 + [26.0], seed=9)
    store(db_url, [measurement("tiled", i, level, seed=i) for i, level in enumerate(spike)])
    assert job(db_url, "tiled").steps == []


def test_settings_and_experiments_are_jobs_of_their_own_and_cpu_jobs_are_not_searched(db_url):
    levels = series([20.0] * 6 + [24.0] * 6, seed=10)
    results = []
    for i, level in enumerate(levels):
        results += [measurement("fused", i, level, seed=i, params={"conv1": {"PR": 1}}),
                    measurement("fused", i, 30.0 * level / 20, seed=100 + i, params={"conv1": {"PR": 2}}),
                    measurement("fused", i, 20.0, seed=200 + i, experiment="cache"),
                    measurement("reference", i, level * 10, seed=300 + i, profiler="cpu")]
    store(db_url, results)
    found = {(h.experiment, h.cell["variant"], h.setting): h for h in histories(db_url)}
    assert set(found) == {("lenet86-baseline", "fused", "conv1 PR=1"), ("lenet86-baseline", "fused", "conv1 PR=2"),
                          ("cache", "fused", "defaults"), ("lenet86-baseline", "reference", "defaults")}
    assert [s.index for s in found["lenet86-baseline", "fused", "conv1 PR=1"].steps] == [6]
    assert [s.index for s in found["lenet86-baseline", "fused", "conv1 PR=2"].steps] == [6]
    assert found["cache", "fused", "defaults"].steps == []
    reference = found["lenet86-baseline", "reference", "defaults"]
    assert not reference.searched and reference.steps == []
    assert [s.index for s in job(db_url, "reference", cpu=True).steps] == [6]
    assert {h.experiment for h in histories(db_url, "cache")} == {"cache"}


# -- `convsweep query regressions` ------------------------------------------------------------------------

def two_jobs(url: str) -> str:
    """tiled slows down by 20% at commit 8; naive stays put."""
    results = []
    for i, (tiled, naive) in enumerate(zip(series([20.0] * 8 + [24.0] * 8, seed=11), series([40.0] * 16, seed=12))):
        results += [measurement("tiled", i, tiled, seed=i), measurement("naive", i, naive, seed=50 + i)]
    return store(url, results)


def test_query_regressions_lists_each_step_in_a_table_and_as_json(db_url, capsys):
    url = as_reader(two_jobs(db_url))
    assert cli_main(["query", "regressions", "--db", url]) in (0, None)
    table = capsys.readouterr().out.splitlines()
    headers = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert headers == REGRESSION_COLUMNS == ["experiment", "job", "setting", "commit", "tree", "before (ms)",
                                             "after (ms)", "ratio", "ratio low", "ratio high", "verdict",
                                             "measurements before/after", "run"]
    (row,) = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]
    assert row[0] == "lenet86-baseline" and row[1].startswith("tiled-") and row[2] == "defaults"
    assert row[3] == commit(8)[:10] and row[4] == "clean" and row[10] == SLOWER and row[11] == "8/8"

    assert cli_main(["query", "regressions", "--db", url, "--format", "json"]) in (0, None)
    (step,) = json.loads(capsys.readouterr().out)
    assert step["verdict"] == SLOWER and step["commit"] == commit(8)[:10]
    assert step["ratio"] == pytest.approx(1.2, rel=0.03) and step["ratio low"] < step["ratio"] < step["ratio high"]
    assert step["before (ms)"] == pytest.approx(20.0, rel=0.03) and step["after (ms)"] == pytest.approx(24.0, rel=0.03)

    assert cli_main(["query", "regressions", "--db", url, "--format", "json", "--param", "threshold=0.5"]) \
        in (0, None)
    assert json.loads(capsys.readouterr().out) == []
    assert cli_main(["query", "regressions", "--db", url, "--format", "csv", "--param", "experiment=cache"]) \
        in (0, None)
    assert capsys.readouterr().out.rstrip("\n").splitlines() == [",".join(REGRESSION_COLUMNS)]  # no such experiment


def test_query_regressions_is_listed_and_fetched_like_a_named_query(tmp_path):
    assert "regressions" not in dict(list_queries())  # the .sql files alone: Datasette serves those
    listed = dict(named_queries())
    assert listed["regressions"] == COMPUTED["regressions"].description and listed["regressions"].endswith("?")
    assert set(dict(list_queries())) < set(listed)
    url = two_jobs(f"sqlite:///{tmp_path / 'results.sqlite'}")
    columns, rows, truncated = fetch(url, "regressions")
    assert columns[0] == "experiment" and len(rows) == 1 and not truncated
    assert fetch(url, " regressions ", max_rows=1).rows == rows
    with pytest.raises(StoreError, match=r"no query named 'regresions' .*known: .*regressions"):
        run_query(url, "regresions")
    with pytest.raises(StoreError, match=r"^regressions: unknown --param since: expected experiment or threshold$"):
        run_query(url, "regressions", params={"since": "x"})
    with pytest.raises(StoreError, match=r"^regressions: --param threshold=big: expected a number"):
        run_query(url, "regressions", params={"threshold": "big"})


def test_query_regressions_opens_the_database_read_only(tmp_path):
    missing = tmp_path / "none.sqlite"
    with pytest.raises(StoreError, match="no database at"):
        run_query(f"sqlite:///{missing}", "regressions")
    assert not missing.exists()  # opened mode=ro: never made
    url = two_jobs(f"sqlite:///{tmp_path / 'results.sqlite'}")
    before = (tmp_path / "results.sqlite").read_bytes()
    run_query(url, "regressions")
    assert (tmp_path / "results.sqlite").read_bytes() == before
