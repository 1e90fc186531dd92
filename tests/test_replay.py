"""`convsweep replay` (convsweep.replay): strategies judged against grids the lent H100 measured whole, with no
GPU. The grids files in tests/data were written by `convsweep replay --save` on the H100 (issue 35's sitting):
lenet86-wide (sweeps/tuning-wide.yaml, 36 jobs, 298 settings) and search-grid (sweeps/search.yaml, 8 jobs, 1,250
settings). The database path is tested on grids stored through the real ingest."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from convsweep.cli import main as cli_main
from convsweep.errors import ConvsweepError
from convsweep.replay import budget_for, judge, load_grids, save_grids, stored_grids

from test_compare import stored as with_samples
from test_history import store

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def search_grids():
    return load_grids(DATA / "search-grids.json")[1]


def test_the_committed_grids_are_the_measured_spaces():
    experiment, grids = load_grids(DATA / "search-grids.json")
    assert experiment == "search-grid" and sum(len(g.params) for g in grids) == 1250 and len(grids) == 8
    assert all(g.best_ms > 0 and any(t is None for t in g.op_time_ms) is not None for g in grids)
    experiment, wide = load_grids(DATA / "tuning-wide-grids.json")
    assert experiment == "lenet86-wide" and sum(len(g.params) for g in wide) == 298


def test_the_grid_always_reaches_the_best_and_measures_everything(search_grids):
    judged = judge(search_grids, "grid")
    assert judged.reached == judged.searches == 8 and judged.measured == judged.settings == 1250


def test_tpe_meets_the_target_on_the_measured_space_where_a_random_sample_does_not(search_grids):
    """The issue's target, on the H100's 1,250 settings (docs/search.md's table): within 2% of the grid's best
    in at least 95% of 20 seeds per grid, measuring at most 20% of the settings; a random sample of the same
    size comes within 2% in about a third of them."""
    tpe, sampled = judge(search_grids, "tpe", "20%", 20), judge(search_grids, "random", "20%", 20)
    assert tpe.measured == sampled.measured <= 0.2 * tpe.settings
    assert tpe.reached >= 0.95 * tpe.searches and sampled.reached <= 0.4 * sampled.searches


def test_budgets_are_a_share_or_a_count():
    assert budget_for("20%", 288) == 57 and budget_for("20%", 3) == 1 and budget_for(500, 288) == 288
    for bad in ("0%", "150%", "x", "-3"):
        with pytest.raises(ConvsweepError, match="replay --budget"):
            budget_for(bad, 10)


def test_a_grids_file_that_is_not_one_is_one_line(tmp_path):
    bad = tmp_path / "g.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConvsweepError, match=r"g.json: format: expected 'convsweep-grids-1'"):
        load_grids(bad)
    bad.write_text("{")
    with pytest.raises(ConvsweepError, match=r"g.json: not a grids file"):
        load_grids(bad)


def test_stored_whole_grids_replay_and_save_a_grids_file(tmp_path, capsys):
    """Five settings of one grid job stored through the real ingest (one failed) make one grid; a sampled job's
    runs do not."""
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    results = []
    for index, (block, ms) in enumerate([(64, 2.0), (128, 1.5), (256, 1.2), (512, None), (1024, 1.9)]):
        result = with_samples("naive", "c0ffee", [ms or 1.0] * 5, status="ok" if ms else "failed")
        measurement = result["measurements"][0] if "measurements" in result else result
        _place(measurement, block, index, {"strategy": "grid"})
        measurement["timings"]["op_time_ms"] = {"conv1": 0.4 * (ms or 1.0), "conv2": 0.6 * (ms or 1.0)}
        results.append(result)
    store(url, results)
    (grid,) = stored_grids(url, "lenet86-baseline")
    assert [p["conv1"]["BLOCK"] for p in grid.params] == [64, 128, 256, 512, 1024]
    assert grid.op_time_ms[3] is None and grid.best_ms == pytest.approx(1.2)  # conv1 + conv2
    out = tmp_path / "grids.json"
    assert cli_main(["replay", "--db", url, "--experiment", "lenet86-baseline", "--save", str(out),
                     "--strategy", "grid,tpe", "--seeds", "3"]) == 0
    shown = capsys.readouterr().out
    assert "lenet86-baseline: 1 grids, 5 settings" in shown and "| tpe " in shown and "| grid " in shown
    assert load_grids(out)[1][0].op_time_ms == grid.op_time_ms
    with pytest.raises(ConvsweepError, match="no stored run of experiment 'nope'"):
        stored_grids(url, "nope")
    save_grids(tmp_path / "again.json", "x", [grid], "test")
    assert load_grids(tmp_path / "again.json")[1][0].params == grid.params


def _place(measurement: dict, block: int, index: int, search: dict) -> None:
    """Make a stored measurement setting `index` of a five-setting naive grid."""
    params = {"conv1": {"BLOCK": block}, "conv2": {"BLOCK": block}}
    measurement["spec"]["params"] = params
    measurement["run_key"] = f"key-{block}"
    measurement["job_id"] = "naive-b10-grid"
    measurement["grid"] = {"job_key": "job-grid", "index": index, "settings": 5, "valid": 5, "search": search}


@pytest.mark.parametrize("args, expected", [
    (["--strategy", "grid,bayes"], "convsweep: replay --strategy: unknown 'bayes': expected one of grid, random, tpe"),
    (["--budget", "0%"], "convsweep: replay --budget: expected a share in (0%, 100%], got 0%"),
    (["--budget", "x"], "convsweep: replay --budget: expected N settings or P%, got 'x'"),
    (["--seeds", "0"], "convsweep: replay --seeds: expected 1 or more, got 0"),
])
def test_a_bad_option_is_one_line_before_any_output(args, expected, capsys):
    assert cli_main(["replay", "--grids", str(DATA / "search-grids.json"), *args]) != 0
    out, err = capsys.readouterr()
    assert out == "" and err.strip().startswith(expected) and len(err.strip().splitlines()) == 1
