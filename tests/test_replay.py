"""`convsweep replay` (convsweep.analysis.replay): strategies judged against grids the lent H100 measured whole, with no
GPU. The grids files in tests/data were written by `convsweep replay --save` on the H100 (issue 35's sitting):
lenet86-wide (sweeps/tuning-wide.yaml, 36 jobs, 298 settings) and search-grid (sweeps/search.yaml, 8 jobs, 1,250
settings). The database path is tested on grids stored through the real ingest."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from convsweep.app.cli import main as cli_main
from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import canonical_hash
from convsweep.analysis.replay import budget_for, judge, load_grids, save_grids, stored_grids

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
    measurement["run_key"] = canonical_hash(measurement["spec"])  # as a job writes it: its spec's hash
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


# -- a grids file checked whole before any verdict (issue 52) ---------------------------------------------------

def small_grids() -> dict:
    """A grids file as `replay --save` writes it: one job of four settings of two tied layers, one of them failed."""
    settings = [{"params": {"conv1": {"BLOCK": block}, "conv2": {"BLOCK": block}},
                 "layer_ms": {"conv1": 0.4 * ms, "conv2": 0.6 * ms}} for block, ms in ((64, 2.0), (128, 1.5), (256, 1.2))]
    settings.append({"params": {"conv1": {"BLOCK": 512}, "conv2": {"BLOCK": 512}}, "layer_ms": None})
    return {"format": "convsweep-grids-1", "experiment": "lenet86-baseline", "source": "the database",
            "jobs": [{"job": "naive-b10", "variant": "naive", "batch": 10, "groups": [["conv1", "conv2"]],
                      "settings": settings}]}


def changed(change) -> dict:
    data = small_grids()
    change(data)
    return data


def _setting(data: dict, index: int) -> dict:
    return data["jobs"][0]["settings"][index]


BROKEN_GRIDS = {  # id: (the change, the line expected after "<file>: ")
    "no-layer-ms": (lambda d: _setting(d, 1).pop("layer_ms"),
                    r"jobs\[0\]\.settings\[1\]: 'layer_ms' is a required property$"),
    "no-settings": (lambda d: d["jobs"][0].pop("settings"), r"jobs\[0\]: 'settings' is a required property$"),
    "string-time": (lambda d: _setting(d, 0)["layer_ms"].update(conv1="fast"),
                    r"jobs\[0\]\.settings\[0\]\.layer_ms\.conv1: expected number, got \"fast\"$"),
    "true-time": (lambda d: _setting(d, 0)["layer_ms"].update(conv1=True),
                  r"jobs\[0\]\.settings\[0\]\.layer_ms\.conv1: expected number, got true$"),
    "nan-time": (lambda d: _setting(d, 0)["layer_ms"].update(conv1=float("nan")),
                 r"not a grids file: jobs\[0\]\.settings\[0\]\.layer_ms\.conv1: expected a finite number, got NaN$"),
    "negative-time": (lambda d: _setting(d, 2)["layer_ms"].update(conv2=-0.5),
                      r"jobs\[0\]\.settings\[2\]\.layer_ms\.conv2: expected more than 0, got -0\.5$"),
    "zero-time": (lambda d: _setting(d, 2)["layer_ms"].update(conv2=0),
                  r"jobs\[0\]\.settings\[2\]\.layer_ms\.conv2: expected more than 0, got 0$"),
    "empty-times": (lambda d: _setting(d, 2).update(layer_ms={}),
                    r"jobs\[0\]\.settings\[2\]\.layer_ms: must not be empty$"),
    "no-setting": (lambda d: d["jobs"][0].update(settings=[]), r"jobs\[0\]\.settings: must not be empty$"),
    "no-job": (lambda d: d.update(jobs=[]), r"jobs: must not be empty$"),
    "string-batch": (lambda d: d["jobs"][0].update(batch="10"),
                     r"jobs\[0\]\.batch: expected \['integer', 'null'\], got \"10\"$"),
    "list-tunable": (lambda d: _setting(d, 0)["params"]["conv1"].update(BLOCK=[64]),
                     r"jobs\[0\]\.settings\[0\]\.params\.conv1\.BLOCK: expected \['number', 'string', 'boolean'\], "
                     r"got \[64\]$"),
    "unknown-key": (lambda d: _setting(d, 0).update(layer_ms_=None),
                    r"jobs\[0\]\.settings\[0\]: unknown key \('layer_ms_' was unexpected\)$"),
    "surrogate-name": (lambda d: d.update(experiment="lenet\ud800"),
                       r"experiment: expected an experiment's name \(1 to 200 characters of text\), "
                       r"got \"lenet\\ud800\"$"),
    "twice-a-setting": (lambda d: _setting(d, 2).update(params=_setting(d, 0)["params"]),
                        r"jobs\[0\]\.settings\[2\]\.params: the setting of settings\[0\] again$"),
    "twice-as-numbers": (lambda d: _setting(d, 1).update(params={"conv1": {"BLOCK": 64.0}, "conv2": {"BLOCK": 64}}),
                         r"jobs\[0\]\.settings\[1\]\.params: the setting of settings\[0\] again$"),
    "a-layer-less": (lambda d: _setting(d, 1)["params"].pop("conv2"),
                     r"jobs\[0\]\.settings\[1\]\.params: expected the layers and tunables of settings\[0\] "
                     r"\(conv1: BLOCK; conv2: BLOCK\), got conv1: BLOCK$"),
    "other-tunable": (lambda d: _setting(d, 3)["params"].update(conv2={"TILE": 8}),
                      r"jobs\[0\]\.settings\[3\]\.params: expected the layers and tunables of settings\[0\] "
                      r"\(conv1: BLOCK; conv2: BLOCK\), got conv1: BLOCK; conv2: TILE$"),
    "a-layer-time-less": (lambda d: _setting(d, 1)["layer_ms"].pop("conv2"),
                          r"jobs\[0\]\.settings\[1\]\.layer_ms: expected the op time of conv1, conv2, got conv1$"),
    "an-ungrouped-layer": (lambda d: d["jobs"][0].update(groups=[["conv1"]]),
                           r"jobs\[0\]\.groups: expected each layer of the params \(conv1, conv2\) in one group, "
                           r"got \[\[\"conv1\"\]\]$"),
    "a-layer-grouped-twice": (lambda d: d["jobs"][0].update(groups=[["conv1", "conv2"], ["conv2"]]),
                              r"jobs\[0\]\.groups: expected each layer of the params \(conv1, conv2\) in one group"),
    "twice-a-job": (lambda d: d["jobs"].append(json.loads(json.dumps(d["jobs"][0]))),
                    r"jobs\[1\]\.job: 'naive-b10' is jobs\[0\] again$"),
}


@pytest.mark.parametrize("name", BROKEN_GRIDS)
def test_a_broken_grids_file_is_one_line_naming_the_key(tmp_path, name):
    """Before: a missing key or a wrong type was a KeyError or TypeError quoted whole, or a traceback (a tunable's
    list in the search, a lone surrogate when printed); a NaN, negative or zero time, a setting or a job twice, a
    layer's time or group missing were replayed into a verdict."""
    change, expected = BROKEN_GRIDS[name]
    path = tmp_path / "grids.json"
    path.write_text(json.dumps(changed(change)))
    with pytest.raises(ConvsweepError, match=f"^{path}: {expected}") as caught:
        load_grids(path)
    assert "\n" not in str(caught.value)


def test_the_file_replay_save_writes_passes_the_checks(tmp_path):
    path = tmp_path / "grids.json"
    path.write_text(json.dumps(small_grids()))
    experiment, (grid,) = load_grids(path)
    assert experiment == "lenet86-baseline" and grid.op_time_ms[3] is None and grid.best_ms == pytest.approx(1.2)
    save_grids(tmp_path / "again.json", experiment, [grid], "test")
    assert load_grids(tmp_path / "again.json")[1][0] == grid


def test_a_grids_file_past_the_bounds_is_refused_unparsed(tmp_path, monkeypatch):
    import convsweep.analysis.replay as replay

    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "convsweep-grids-1", "jobs": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConvsweepError, match=rf"^{deep}: not a grids file: not valid JSON: nested more than 64 "
                                             r"levels deep$"):
        load_grids(deep)
    path = tmp_path / "grids.json"
    path.write_text(json.dumps(small_grids()))
    monkeypatch.setattr(replay, "MAX_GRIDS_BYTES", 500)
    with pytest.raises(ConvsweepError, match=rf"^{path}: not a grids file: {path.stat().st_size:,} bytes; a result "
                                             r"file holds at most 500$"):
        load_grids(path)


@pytest.mark.parametrize("name", ["nan-time", "negative-time", "twice-a-setting", "twice-a-job", "a-layer-time-less",
                                  "an-ungrouped-layer", "surrogate-name", "list-tunable"])
def test_replay_of_a_broken_grids_file_prints_no_verdict(tmp_path, capsys, name):
    change, expected = BROKEN_GRIDS[name]
    path = tmp_path / "grids.json"
    path.write_text(json.dumps(changed(change)))
    assert cli_main(["replay", "--grids", str(path), "--strategy", "grid,random", "--seeds", "2"]) != 0
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert re.match(f"convsweep: {re.escape(str(path))}: {expected}", err.strip())


def test_the_help_prints_its_percent_signs_once():
    import subprocess
    import sys

    text = subprocess.run([sys.executable, "-m", "convsweep", "replay", "--help"], capture_output=True, text=True).stdout
    assert "within 2% of the grid's best" in text and "%%" not in text
