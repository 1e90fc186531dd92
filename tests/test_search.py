"""Model-guided search (convsweep.sweep.search): the proposals are valid settings, each at most once, within the budget
and reproducible by seed; a failed or wrong setting is told as a failure, never as a time; a guided job over the
fake GPU measures its budget in the order proposed, says so in each measurement, and resumes where it stopped;
and the sweep file's search is checked with one line per mistake."""
from __future__ import annotations

import copy
import itertools
import math

import pytest

from convsweep.sweep.config import expand_config, load_config
from convsweep.base.errors import ConfigError
from convsweep.measure.job import run_job as run_one_job
from convsweep.measure.record import SettingCounts
from convsweep.sweep.search import COMPILE_AHEAD, Search, objective, proposals, run

from test_config import BASE, write
# fake_forward_once_per_batch: test_job's autouse fixture, autouse here too (the guided jobs run the same batches)
from test_job import BLOCKS, GRID, GridNetwork, fake_forward_once_per_batch, grid_job  # noqa: F401


def space(holes: int = 0) -> list[dict]:
    """Two conv layers' tunables, 6 x 5 x 4 = 120 settings, less every `holes`-th (a restriction's gaps)."""
    settings = [{"conv1": {"BLOCK": b, "UNROLL": u}, "conv2": {"TILE": t}}
                for b, u, t in itertools.product([32, 64, 128, 256, 512, 1024], [1, 2, 3, 4, 8], [4, 8, 16, 32])]
    return [s for k, s in enumerate(settings) if not holes or k % holes]


def bowl(params: dict) -> float:
    """A smooth landscape with one best setting (BLOCK 256, UNROLL 3, TILE 8) and 1% ripples."""
    b, u, t = params["conv1"]["BLOCK"], params["conv1"]["UNROLL"], params["conv2"]["TILE"]
    ripple = 1 + 0.01 * math.sin(b * 7 + u * 13 + t * 17)
    return (1 + abs(math.log2(b / 256))) * (1 + 0.2 * abs(u - 3)) * (1 + 0.1 * abs(math.log2(t / 8))) * ripple


def drain(search: Search, value) -> list[int]:
    """Measure what `search` proposes until it stops; `value(index)` is a setting's Op Time (None: failed),
    told as conv1's op time."""
    order = []
    while batch := search.propose():
        for index in batch:
            search.tell(index, timed(value(index)))
        order += batch
    return order


def timed(op_time_ms: float | None) -> dict[str, float] | None:
    return None if op_time_ms is None else {"conv1": op_time_ms}


@pytest.mark.parametrize("strategy", ["tpe", "genetic"])
def test_proposals_are_valid_settings_each_once_within_the_budget(strategy):
    candidates = space(holes=7)
    search = Search(candidates, strategy, budget=40, seed=3)
    first = search.propose()
    assert len(first) == COMPILE_AHEAD  # a round at once, to compile in parallel
    for index in first:
        search.tell(index, timed(bowl(candidates[index])))
    order = first + drain(search, lambda i: bowl(candidates[i]))
    assert len(order) == 40 == len(set(order)) and all(0 <= i < len(candidates) for i in order)
    assert search.order == order and [search.proposal_of(i) for i in order] == list(range(40))
    assert search.propose() == []  # the budget is spent


def test_a_budget_past_the_candidates_measures_each_once():
    candidates = space()[:10]
    order = drain(Search(candidates, "tpe", budget=50, seed=1), lambda i: bowl(candidates[i]))
    assert sorted(order) == list(range(10))


def test_the_same_seed_proposes_the_same_settings():
    candidates = space(holes=5)
    runs = [drain(Search(candidates, "tpe", budget=30, seed=seed), lambda i: bowl(candidates[i])) for seed in (4, 4, 5)]
    assert runs[0] == runs[1] != runs[2]


def test_a_failed_or_wrong_setting_is_told_as_a_failure_never_as_a_time():
    candidates = space()
    broken = {i for i, s in enumerate(candidates) if s["conv1"]["BLOCK"] == 1024}
    search = Search(candidates, "tpe", budget=60, seed=2)
    order = drain(search, lambda i: None if i in broken else bowl(candidates[i]))
    ((_, _, study, _),) = search._studies  # one group: the layers move together unless told otherwise
    complete: dict[tuple, list[float]] = {}
    for trial in study.trials:
        if trial.state.name == "COMPLETE":
            complete.setdefault(tuple(sorted(trial.params.items())), []).append(trial.value)
    assert any(i in broken for i in order)  # it did try them
    for index in order:
        code = tuple(sorted((name, int(search.codes[index, d])) for d, name in enumerate(search.dimensions)))
        if index in broken:
            assert code not in complete  # told as failed: no time the sampler could learn from
        else:
            assert complete[code] == [pytest.approx(bowl(candidates[index]))]
    assert objective("incorrect", {"conv1": 0.1}) is None and objective("suspect", {"conv1": 0.1}) is None
    assert objective("failed", {}) is None and objective("ok", {"conv1": 0.25, "conv2": 0.5}) == {"conv1": 0.25,
                                                                                                  "conv2": 0.5}


def test_guided_strategies_find_the_best_of_a_smooth_space_far_more_often_than_a_random_sample():
    """Measuring a fifth of a landscape whose best is alone within 2% (its neighbours are 10% off): over 20
    seeds each guided strategy reaches it at least twice as often as a random sample of the same size.
    The issue's target (19 of 20) is judged on a measured grid, whose best has company: test_replay."""
    candidates = space()
    values = [bowl(s) for s in candidates]
    best, budget = min(values), len(candidates) // 5

    def hits(strategy: str) -> int:
        outcomes = [run(candidates, lambda i: timed(values[i]), {"strategy": strategy, "budget": budget, "seed": seed},
                        target=best) for seed in range(20)]
        return sum(o.reached_after is not None for o in outcomes)

    sampled = hits("random")
    assert hits("tpe") >= 2 * sampled and hits("genetic") >= 2 * sampled


def test_layers_tuned_on_their_own_are_searched_apart_each_told_its_own_time():
    """conv1 and conv2 each with 12 settings: 144 in all. Told each layer's op time, a sampler per layer finds
    the best pair in 20 of 20 seeds with a fifth of the space; one sampler over both, told their sum, less often."""
    per_layer = [{"B": b, "U": u} for b, u in itertools.product([32, 64, 128, 256], [1, 2, 3])]
    candidates = [{"conv1": a, "conv2": b} for a, b in itertools.product(per_layer, per_layer)]

    def layer_ms(params: dict) -> dict[str, float]:
        return {layer: (1 + abs(math.log2(p["B"] / (64 if layer == "conv1" else 256)))) * (1 + 0.3 * abs(p["U"] - 2))
                for layer, p in params.items()}

    best = min(sum(layer_ms(c).values()) for c in candidates)

    def hits(groups) -> int:
        return sum(run(candidates, lambda i: layer_ms(candidates[i]), {"strategy": "tpe", "budget": 28, "seed": seed},
                       target=best, groups=groups).reached_after is not None for seed in range(20))

    apart, together = hits([["conv1"], ["conv2"]]), hits(None)
    assert apart == 20 and together < apart


def test_proposals_resume_what_was_measured_before():
    candidates = space()
    told = [(5, {"conv1": 1.5}), (17, None)]
    search = proposals(candidates, {"strategy": "tpe", "budget": 6, "seed": 1},
                       todo=[i for i in range(len(candidates)) if i not in (5, 17)], told=told)
    order = drain(search, lambda i: bowl(candidates[i]))
    assert search.order[:2] == [5, 17] and len(order) == 4 and not {5, 17} & set(order)
    assert proposals(candidates, {"strategy": "grid"}, todo=[3, 4]).propose() == [3, 4]


# -- a guided job over the fake GPU -------------------------------------------------------------------
@pytest.fixture(autouse=True)
def fresh_grid_network():
    GridNetwork.built, GridNetwork.interrupt_at = [], None


TPE3 = {"strategy": "tpe", "budget": 3, "seed": 11}


def test_a_guided_job_measures_its_budget_in_the_order_proposed(tmp_path):
    job = grid_job(search=TPE3)
    assert job.settings().guided and job.settings().budget == 3 and len(job.runs()) == 5  # all are candidates
    result = run_one_job(job, tmp_path / "grid.json", backend=GRID)
    ms = result.measurements
    assert [m.params["conv1"]["BLOCK"] for m in ms] == GridNetwork.built and len(set(GridNetwork.built)) == 3
    assert [m.grid.proposal for m in ms] == [0, 1, 2]
    assert all(m.grid.settings == 3 and m.grid.valid == 5 and m.grid.search == TPE3 for m in ms)
    assert result.settings == SettingCounts(valid=5, measured=3, resumed=0)
    assert "proposal" not in run_one_job(grid_job(), tmp_path / "g2.json", backend=GRID).measurements[0].grid.to_json()


def test_an_interrupted_guided_job_resumes_its_search(tmp_path):
    out = tmp_path / "grid.json"
    run_one_job(grid_job(search={**TPE3, "budget": 4}), tmp_path / "whole.json", backend=GRID)
    whole = list(GridNetwork.built)
    GridNetwork.built, GridNetwork.interrupt_at = [], whole[2]
    with pytest.raises(KeyboardInterrupt):
        run_one_job(grid_job(search={**TPE3, "budget": 4}), out, backend=GRID)
    assert GridNetwork.built == whole[:2]
    GridNetwork.built, GridNetwork.interrupt_at = [], None
    result = run_one_job(grid_job(search={**TPE3, "budget": 4}), out, backend=GRID)
    blocks = [m.params["conv1"]["BLOCK"] for m in result.measurements]
    assert blocks[:2] == whole[:2] and len(set(blocks)) == 4 and GridNetwork.built == blocks[2:]
    assert result.settings == SettingCounts(valid=5, measured=2, resumed=2)
    assert [m.grid.proposal for m in result.measurements] == [0, 1, 2, 3]


def test_a_guided_job_that_fails_before_measuring_stores_its_first_proposals_failed(tmp_path):
    missing = {"name": "fashion", "images": str(tmp_path / "nope-images.gz"), "labels": str(tmp_path / "nope-labels.gz")}
    ms = run_one_job(grid_job(dataset=missing, search=TPE3), tmp_path / "grid.json", backend=GRID).measurements
    assert len(ms) == 3 and all(m.status == "failed" and "nope-images.gz" in m.error for m in ms)
    assert set(BLOCKS) >= {m.params["conv1"]["BLOCK"] for m in ms} and GridNetwork.built == []


# -- the sweep file -----------------------------------------------------------------------------------
GRID12 = {"BLOCK_M": [4, 16, 64], "BLOCK_N": [128, 256], "BLOCK_K": [8, 16], "THREAD_M": [4, 8], "THREAD_N": [4, 8]}


def sweep(tmp_path, search: dict):
    data = copy.deepcopy(BASE)
    data["experiments"]["e1"].update(variants=["register_tiled_gemm"], params={"register_tiled_gemm": GRID12},
                                     search=search)
    return write(tmp_path, data)


def test_a_guided_search_in_the_sweep_file_plans_jobs_of_its_budget(tmp_path):
    jobs = expand_config(load_config(sweep(tmp_path, {"strategy": "tpe", "budget": 4, "seed": 2})))
    settings = jobs[0].settings()
    assert settings.guided and settings.budget == 4 and settings.valid == 12 == len(settings.chosen)
    other = expand_config(load_config(sweep(tmp_path, {"strategy": "tpe", "budget": 4, "seed": 3})))[0]
    assert other.job_id != jobs[0].job_id  # the seed is part of what the job is


@pytest.mark.parametrize("search, expected", [
    ({"strategy": "tpe", "seed": 1}, "experiments.e1.search.budget: the tpe strategy needs a budget"),
    ({"strategy": "genetic", "budget": 5}, "experiments.e1.search: 'seed' is a required property"),
    ({"strategy": "random", "budget": 5, "max_settings": 5, "seed": 1},
     "experiments.e1.search: budget and max_settings are one thing"),
    ({"strategy": "tpe", "max_settings": 5, "seed": 1}, "experiments.e1.search.max_settings: the tpe strategy takes budget"),
    ({"strategy": "grid", "budget": 5}, "experiments.e1.search.budget: the grid strategy measures every setting"),
    ({"strategy": "bayes", "budget": 5, "seed": 1}, "experiments.e1.search.strategy"),
])
def test_a_search_that_cannot_run_is_one_line(tmp_path, search, expected):
    with pytest.raises(ConfigError) as info:
        expand_config(load_config(sweep(tmp_path, search)))
    assert expected in str(info.value) and "\n" not in str(info.value)
