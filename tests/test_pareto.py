"""Fronts of op time against energy per pass (convsweep.analysis.pareto) on synthetic runs stored through the real ingest:
a known front per conv layer and cell, ties and dominated settings, runs without energy left out and counted,
suspect and incorrect runs (and a setting whose latest measurement is suspect) never on it; `convsweep query pareto`
as a table and as JSON, read-only, listed by `convsweep query --list`, on SQLite and PostgreSQL; and the report's
table of the variants on each front."""
from __future__ import annotations

import json

import pytest

from convsweep import report
from convsweep.app.cli import main as cli_main
from convsweep.base.errors import StoreError
from convsweep.analysis.pareto import PARETO_COLUMNS, fronts, non_dominated
from convsweep.analysis.questions import COMPUTED, fetch_question, named_queries, run_question

from store_fixtures import as_reader
from test_compare import stored
from test_history import store
from test_stats import noisy

EXPERIMENT = "lenet86-baseline"
COMMIT = "c" * 40
SAMPLES = 10
CONV1_SHARE = 0.4  # test_compare.stored: conv1 takes 40% of each pass's op time, conv2 60%

# variant -> (op time of a pass in ms, energy per pass in J; None: not measured), at batch 100.
SETTINGS = {
    "fast": (10.0, 7.0),
    "tiled": (20.0, 6.0),
    "naive": (40.0, 5.0),
    "slow": (30.0, 8.0),  # tiled beats it on both
    "tie": (25.0, 6.0),  # as little energy as tiled, but slower
    "unmetered": (5.0, None),  # the fastest of all, without energy: left out, counted
}
FRONT = ["fast", "tiled", "naive"]


def energy(joules_per_pass: float, passes: int = SAMPLES) -> dict:
    return {"joules": joules_per_pass * passes, "passes": passes, "joules_per_pass": joules_per_pass}


def setting(variant: str, op_time_ms: float, joules: float | None, seed: int, **kwargs) -> dict:
    """A run of `variant` whose passes take about `op_time_ms` (conv layers added up), at `joules` per pass."""
    return stored(variant, COMMIT, noisy(op_time_ms, SAMPLES, 0.003, seed),
                  energy=energy(joules) if joules is not None else None, **kwargs)


def known_results() -> list[dict]:
    """SETTINGS at batch 100; at batch 1000 naive alone; a suspect and an incorrect run far below every front; a
    setting whose older measurement is ok and on the front but whose latest is suspect; another experiment."""
    results = [setting(variant, time, joules, seed) for seed, (variant, (time, joules)) in enumerate(SETTINGS.items())]
    results += [setting("naive", 400.0, 50.0, 10, batch=1000),
                setting("suspect", 1.0, 1.0, 11, status="suspect"),
                setting("incorrect", 1.0, 1.0, 12, status="incorrect"),
                setting("failed", 1.0, 1.0, 13, status="failed"),
                setting("remeasured", 2.0, 2.0, 14, started_at="2026-11-20T10:00:00+00:00"),
                setting("remeasured", 2.0, 2.0, 15, status="suspect", started_at="2026-11-21T10:00:00+00:00"),
                setting("fast", 10.0, 7.0, 16, experiment="other")]
    return results


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> str:
    return store(f"sqlite:///{tmp_path_factory.mktemp('pareto') / 'results.sqlite'}", known_results())


def by_key(found) -> dict:
    return {(f.experiment, f.layer, f.batch): f for f in found}


# -- the front ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("points", "expected"), [
    ([], []),
    ([(1.0, 1.0)], [True]),
    ([(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)], [True, True, True]),  # a trade-off at every step
    ([(2.0, 2.0), (1.0, 1.0), (3.0, 3.0)], [False, True, False]),  # one beats both others
    ([(1.0, 2.0), (2.0, 2.0)], [True, False]),  # equal energy, slower: beaten
    ([(1.0, 2.0), (1.0, 3.0)], [True, False]),  # equal time, more energy: beaten
    ([(1.0, 2.0), (1.0, 2.0), (3.0, 1.0)], [True, True, True]),  # two equal points: neither beats the other
])
def test_non_dominated_keeps_exactly_the_points_nothing_beats_on_both(points, expected):
    assert non_dominated(points) == expected


def test_each_layer_and_cell_has_its_front_fastest_first(known):
    found = by_key(fronts(known))
    assert set(found) == {(EXPERIMENT, layer, batch) for layer in ("conv1", "conv2") for batch in (100, 1000)} | {
        ("other", "conv1", 100), ("other", "conv2", 100)}
    for layer, share in (("conv1", CONV1_SHARE), ("conv2", 1 - CONV1_SHARE)):
        front = found[EXPERIMENT, layer, 100]
        assert [p.variant for p in front.front] == FRONT
        assert {p.variant for p in front.measured} == set(SETTINGS) - {"unmetered"}
        assert [p.variant for p in front.points][0] == "unmetered"  # timed, fastest, but without energy
        for point in front.measured:
            time, joules = SETTINGS[point.variant]
            assert point.op_time_ms == pytest.approx(share * time, rel=0.01)
            assert point.low_ms < point.op_time_ms < point.high_ms and point.high_ms / point.low_ms < 1.02
            assert point.energy_per_pass_j == joules and point.setting == "defaults"
        assert front.cell_text == "s1 pageable" and front.cell["profiler"] == "nsys"
    assert [p.variant for p in found[EXPERIMENT, "conv1", 1000].front] == ["naive"]


def test_suspect_incorrect_and_failed_runs_are_never_on_a_front(known):
    """Nor is a setting whose latest measurement is suspect, though its older ok one would beat every other."""
    variants = {p.variant for front in fronts(known) for p in front.points}
    assert not variants & {"suspect", "incorrect", "failed", "remeasured"}


def test_a_front_is_taken_per_cell_and_a_setting_by_its_tunables(tmp_path):
    url = store(f"sqlite:///{tmp_path / 'r.sqlite'}", [
        setting("tiled", 20.0, 6.0, 1, params={"conv1": {"TILE": 8}, "conv2": {"TILE": 8}}),
        setting("tiled", 15.0, 7.0, 2, params={"conv1": {"TILE": 16}, "conv2": {"TILE": 16}}),
        setting("naive", 40.0, 9.0, 3),  # beaten by both tiles at one stream
        setting("naive", 40.0, 9.0, 4, streams=2)])  # alone at two: its own front
    found = {(f.layer, f.cell_text): f for f in fronts(url, EXPERIMENT)}
    assert set(found) == {(layer, cell) for layer in ("conv1", "conv2") for cell in ("s1 pageable", "s2 pageable")}
    one = found["conv1", "s1 pageable"]
    assert [p.setting for p in one.front] == ["conv1 TILE=16; conv2 TILE=16", "conv1 TILE=8; conv2 TILE=8"]
    assert [p.variant for p in found["conv1", "s2 pageable"].front] == ["naive"]


# -- `convsweep query pareto` ---------------------------------------------------------------------------------

def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_query_pareto_lists_each_front_in_a_table_and_as_json(db_url, capsys):
    url = as_reader(store(db_url, known_results()))
    assert cli_main(["query", "pareto", "--db", url, "--param", f"experiment={EXPERIMENT}"]) in (0, None)
    out = capsys.readouterr().out
    table, note = out.rstrip("\n").rsplit("\n\n", 1)
    lines = table.splitlines()
    assert cells(lines[0]) == PARETO_COLUMNS == [
        "experiment", "layer", "batch", "cell", "variant", "setting", "op time (ms)", "low (ms)", "high (ms)",
        "energy per pass (J)", "front/settings", "run"]
    rows = [cells(line) for line in lines[2:]]
    assert [(r[1], r[2], r[4], r[10]) for r in rows] == [
        *(("conv1", "100", v, "3/5") for v in FRONT), ("conv1", "1000", "naive", "1/1"),
        *(("conv2", "100", v, "3/5") for v in FRONT), ("conv2", "1000", "naive", "1/1")]
    assert note == ("1 ok setting without an energy per pass left out (a sweep with energy_window_s 0 measures none, "
                    "nor does a GPU without NVML's energy counter)")

    assert cli_main(["query", "pareto", "--db", url, "--format", "json"]) in (0, None)
    captured = capsys.readouterr()
    found = json.loads(captured.out)
    assert captured.err.strip() == note  # JSON stays JSON: the line goes to stderr
    assert len(found) == 2 * (3 + 1 + 1)  # the other experiment's fast alone on its fronts
    first = found[0]
    assert (first["experiment"], first["layer"], first["batch"], first["variant"]) == ("lenet86-baseline", "conv1",
                                                                                        100, "fast")
    assert first["op time (ms)"] == pytest.approx(4.0, rel=0.01) and first["energy per pass (J)"] == 7.0
    assert first["low (ms)"] < first["op time (ms)"] < first["high (ms)"]


def test_query_pareto_is_listed_and_checks_its_params(known, capsys):
    assert "pareto" in dict(named_queries()) and COMPUTED["pareto"].description.endswith("?")
    assert cli_main(["query", "--list"]) in (0, None)
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pareto ")]
    assert listed == [f"{'pareto':12s} {COMPUTED['pareto'].description}"]
    answer = fetch_question(known, "pareto", {"experiment": "other"})
    assert [row[4] for row in answer.rows] == ["fast", "fast"] and not answer.truncated
    assert fetch_question(known, "pareto", max_rows=2).truncated
    with pytest.raises(StoreError, match=r"^pareto: unknown --param batch: expected experiment$"):
        run_question(known, "pareto", params={"batch": "100"})


def test_no_energy_anywhere_is_an_empty_front_and_its_count(tmp_path):
    url = store(f"sqlite:///{tmp_path / 'r.sqlite'}",
                [setting("naive", 40.0, None, 1), setting("tiled", 20.0, None, 2)])
    assert run_question(url, "pareto", fmt="csv").splitlines() == [",".join(PARETO_COLUMNS)]  # no row
    assert run_question(url, "pareto").endswith("\n\n2 ok settings without an energy per pass left out (a sweep with "
                                                "energy_window_s 0 measures none, nor does a GPU without NVML's "
                                                "energy counter)")


def test_query_pareto_opens_the_database_read_only(known, tmp_path):
    path = known.removeprefix("sqlite:///")
    with open(path, "rb") as before_file:
        before = before_file.read()
    run_question(known, "pareto")
    with open(path, "rb") as after_file:
        assert after_file.read() == before


# -- the report -------------------------------------------------------------------------------------------------

def sections(text: str) -> dict[str, str]:
    return {part.split("\n", 1)[0].strip(): part for part in text.split("\n## ")[1:]}


def test_the_report_names_the_variants_on_each_front(known, tmp_path):
    report.write(known, EXPERIMENT, markdown=tmp_path / "report.md")
    parts = sections((tmp_path / "report.md").read_text())
    assert list(parts)[-2:] == ["Op time against energy", "Figures"]
    text = parts["Op time against energy"]
    rows = [cells(line) for line in text.splitlines() if line.startswith("| conv")]
    assert rows == [["conv1", "100", "`fast`, `tiled`, `naive`", "3/5"], ["conv1", "1000", "`naive`", "1/1"],
                    ["conv2", "100", "`fast`, `tiled`, `naive`", "3/5"], ["conv2", "1000", "`naive`", "1/1"]]
    assert "1 ok setting without an energy per pass left out" in text and "`convsweep query pareto`" in text


def test_the_report_counts_a_variants_settings_and_leaves_the_section_out_without_energy(tmp_path):
    url = store(f"sqlite:///{tmp_path / 'r.sqlite'}", [
        setting("tiled", 20.0, 6.0, 1, params={"conv1": {"TILE": 8}, "conv2": {"TILE": 8}}),
        setting("tiled", 15.0, 7.0, 2, params={"conv1": {"TILE": 16}, "conv2": {"TILE": 16}}),
        setting("naive", 40.0, 5.0, 3), setting("naive", 40.0, None, 4, experiment="unmetered")])
    report.write(url, EXPERIMENT, markdown=tmp_path / "report.md")
    text = sections((tmp_path / "report.md").read_text())["Op time against energy"]
    assert [cells(line) for line in text.splitlines() if line.startswith("| conv1")] == [
        ["conv1", "100", "`tiled` (2 settings), `naive`", "3/3"]]
    assert "left out" not in text  # the run without energy is another experiment's
    report.write(url, "unmetered", markdown=tmp_path / "unmetered.md")
    assert "Op time against energy" not in sections((tmp_path / "unmetered.md").read_text())
