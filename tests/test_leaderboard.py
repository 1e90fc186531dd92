"""`convsweep leaderboard` (convsweep/analysis/leaderboard.py) on both backends: boards per GPU model and cell, each
submission's best trusted run, statistical tiers, the runs not ranked and why, points, CSV and the HTML page; and the
tier rule on samples made to beat it."""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json

import numpy as np
import pytest

from convsweep.analysis.leaderboard import (CSV_COLUMNS, DEFAULT_THRESHOLD, Entry, csv_rows, leaderboard, load_points,
                                            render, run_submission, submission_of, tiers, write_html)
from convsweep.app.commands import leaderboard as command
from convsweep.base.errors import ConfigError, ConvsweepError
from convsweep.base.numbers import median
from convsweep.base.stats import bootstrap_ratio, relative_spread
from convsweep.store import ingest_result, open_store
from leaderboard_fixtures import (A100, CHEAT_FINDINGS, EXPERIMENT, H100, REASONS, course_files, course_run, drawn,
                                  mark_timed_out)

POINTS_YAML = """\
description: ECE408 fall 2026, milestone 3
points:
  - {batch: 10000, op_time_sum_ms_at_most: 80, points: 100}
  - {batch: 10000, op_time_sum_ms_at_most: 100, points: 60}
  - {batch: 10000, gpu: "NVIDIA A100-SXM4-40GB", op_time_sum_ms_at_most: 90, points: 100}
"""


@pytest.fixture(scope="module")
def course_url(module_db_url):
    """The course of leaderboard_fixtures.course_files(), s09's run marked timed out. Made once per backend."""
    engine = open_store(module_db_url)
    for job_file in course_files():
        ingest_result(engine, job_file, None)
    mark_timed_out(engine)
    engine.dispose()
    return module_db_url


def board_of(boards, gpu=H100, batch=10000):
    [board] = [b for b in boards if b.gpu == gpu and b.cell["batch"] == batch]
    return board


def standings(board):
    return [(e.submission, e.rank, e.tier) for e in board.ranked]


def test_a_submission_is_the_name_before_the_double_underscore():
    assert submission_of("s042__tiled") == "s042"
    assert submission_of("s042__tiled__v2") == "s042"
    assert submission_of("naive") == "naive"  # no separator: its own submission
    assert submission_of("__tiled") == "__tiled"  # nothing before it: the name
    assert run_submission({"conv1": "s1__a", "conv2": "s1__b"}, "conv1=s1__a,conv2=s1__b") == "s1"
    assert run_submission({"conv1": "s2__a", "conv2": "s1__b"}, "mixed") == "s1+s2"  # two students' kernels


def test_same_distribution_shares_a_tier_and_the_slower_one_starts_the_next(course_url):
    board = board_of(leaderboard(course_url, EXPERIMENT))
    # s01 and s02 were drawn from one distribution: one tier, one rank; s03 (+29%) the next tier, ranked 3rd
    assert standings(board)[:3] == [("s01", 1, 1), ("s02", 1, 1), ("s03", 3, 2)]
    s01, s02, s03 = board.ranked[:3]
    assert s01.variant == "s01__tiled"  # its best of two variants (s01__naive is 7% slower)
    assert s01.against is None and s01.ratio is None and 0 < s01.detectable < 0.01
    assert s02.against == "s01" and s02.low <= 1 + DEFAULT_THRESHOLD
    assert s03.against == "s01" and s03.low > 1.2
    assert s01.op_time_sum_ms == pytest.approx(70, rel=0.01) and s01.samples == 30
    assert s01.op_time_sum_ms <= s02.op_time_sum_ms <= s03.op_time_sum_ms


def test_two_samples_are_listed_without_a_tier_and_say_so(course_url):
    board = board_of(leaderboard(course_url, EXPERIMENT))
    [few] = [e for e in board.ranked if e.submission == "s08"]
    assert (few.rank, few.tier, few.samples) == (None, None, 2)
    assert few.reason == "2 samples: too few to tell apart from any other (at least 5 to be tiered)"


def test_runs_not_ranked_are_listed_with_their_reasons_and_findings(course_url):
    board = board_of(leaderboard(course_url, EXPERIMENT))
    listed = {e.submission: e for e in board.not_ranked}
    assert {name: e.status for name, e in listed.items()} == {
        "s04": "incorrect", "s05": "suspect", "s06": "failed", "s07": "fast-checks", "s09": "timeout"}
    for name, status in (("s04", "incorrect"), ("s05", "suspect"), ("s06", "failed"), ("s09", "timeout")):
        assert listed[name].reason == REASONS[status]
    assert listed["s07"].reason.startswith("measured with `checks: fast`")
    assert listed["s05"].findings == ("s05__memo_forward: writes module-scope global memory, "
                                      "reads %globaltimer or %clock")
    assert set(CHEAT_FINDINGS) == {listed["s05"].findings.split(":")[0]}
    # the fastest times of the board are the incorrect and the suspect runs': neither ranks
    assert not {"s04", "s05", "s06", "s07", "s09"} & {e.submission for e in board.ranked}


def test_gpu_models_are_never_ranked_together(course_url):
    boards = leaderboard(course_url)
    assert [(b.gpu, b.cell["batch"]) for b in boards] == [(A100, 10000), (H100, 1000), (H100, 10000)]
    # on the A100 s03 leads s01; on the H100 s01 leads s03
    assert standings(board_of(boards, A100)) == [("s03", 1, 1), ("s01", 2, 2)]
    # One setting (s01__tiled at batch 10000) measured on both: each GPU keeps its own newest measurement, where
    # latest_run would keep one of the two for both
    a100_run = board_of(boards, A100).ranked[1].run_id
    h100_run = board_of(boards, H100).ranked[0].run_id
    assert a100_run != h100_run
    assert board_of(boards, H100).ranked[0].op_time_sum_ms < 75 < board_of(boards, A100).ranked[1].op_time_sum_ms


def test_unchecked_and_not_fresh_runs_are_not_ranked(db_url):
    engine = open_store(db_url)
    rng = np.random.default_rng(5)
    for job_file in (course_run("s10__old", drawn(rng, 10.0, 20.0), checks=None),
                     course_run("s11__seen", drawn(rng, 10.0, 20.0), fresh=False),
                     course_run("s12__ok", drawn(rng, 20.0, 40.0))):
        ingest_result(engine, job_file, None)
    engine.dispose()
    [board] = leaderboard(db_url)
    assert standings(board) == [("s12", 1, 1)]
    assert {e.submission: (e.status, e.reason) for e in board.not_ranked} == {
        "s10": ("unchecked", "no integrity checks ran (stored before them)"),
        "s11": ("not-fresh", "some timed passes ran on inputs its kernel had seen (stored before every pass was "
                             "fresh)")}
    assert [e["ranked"][0]["submission"] for e in json.loads(render([board], "json"))] == ["s12"]


def test_fast_checked_runs_rank_when_asked_and_are_marked(course_url):
    boards = leaderboard(course_url, EXPERIMENT, fast_checks=True)
    board = board_of(boards)
    assert standings(board)[:4] == [("s07", 1, 1), ("s01", 2, 2), ("s02", 2, 2), ("s03", 4, 3)]
    assert board.ranked[0].checks == "fast"
    assert "fast checks" in render(boards)  # the table's note says how it was checked
    assert "s07" not in {e.submission for e in board.not_ranked}


def test_points_come_from_the_thresholds_file(course_url, tmp_path):
    (tmp_path / "points.yaml").write_text(POINTS_YAML)
    boards = leaderboard(course_url, EXPERIMENT, points=load_points(tmp_path / "points.yaml"))
    h100 = {e.submission: e.points for e in board_of(boards).standing()}
    assert h100 == {"s01": 100, "s02": 100, "s03": 60, "s08": 60,  # 70, 70, 90, 99.9 ms
                    "s04": 0, "s05": 0, "s06": 0, "s07": 0, "s09": 0}  # no trusted time, no points
    assert {e.submission: e.points for e in board_of(boards, A100).ranked} == {"s03": 100, "s01": 0}  # 85, 105 ms
    assert [e.points for e in board_of(boards, H100, 1000).ranked] == [0]  # no rule for batch 1000


@pytest.mark.parametrize("text, expected", [
    ("points:\n  - {op_time_sum_ms_at_most: -5, points: 10}\n",
     r"^{file}:2: points\[0\]\.op_time_sum_ms_at_most: expected more than 0, got -5$"),
    ("points:\n  - {op_time_sum_ms_at_most: 80, point: 10}\n",
     r"^{file}:2: points\[0\]\.point: unknown key; did you mean 'points'\?$"),
    ("points:\n  - {op_time_sum_ms_at_most: 80, points: 10, batch: 0}\n",
     r"^{file}:2: points\[0\]\.batch: expected at least 1, got 0$"),
    ("points: []\n", r"^{file}:1: points: must not be empty$"),
    ("thresholds: 80\n", r"^{file}:1: thresholds: unknown key"),
    ("points: [\n", r"^{file}:2: "),
    ("", r"^{file}: \(top level\): expected object, got null$"),
])
def test_a_bad_points_file_is_one_line(tmp_path, text, expected):
    path = tmp_path / "points.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_points(path)
    assert "\n" not in str(caught.value)
    assert caught.match(expected.replace("{file}", str(path).replace(".", r"\.")))


def test_a_missing_points_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"points\.yaml: no such file$"):
        load_points(tmp_path / "points.yaml")


def test_csv_is_one_row_per_submission_and_batch(course_url, tmp_path):
    (tmp_path / "points.yaml").write_text(POINTS_YAML)
    boards = leaderboard(course_url, EXPERIMENT, points=load_points(tmp_path / "points.yaml"))
    rows = list(csv.DictReader(io.StringIO(render(boards, "csv"))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == len(csv_rows(boards)) == 2 + 1 + 9
    h100 = [r for r in rows if r["gpu"] == H100 and r["batch"] == "10000"]
    assert [r["submission"] for r in h100] == ["s01", "s02", "s03", "s08", "s04", "s05", "s06", "s07", "s09"]
    first, third, wrong = h100[0], h100[2], h100[4]
    assert (first["rank"], first["tier"], first["status"], first["points"], first["reason"]) == ("1", "1", "ok", "100", "")
    assert float(first["op_time_sum_ms"]) == pytest.approx(70, rel=0.01)
    assert float(first["op_time_1_ms"]) + float(first["op_time_2_ms"]) == pytest.approx(70, rel=0.01)
    assert (third["rank"], third["tier"], third["points"]) == ("3", "2", "60")
    assert float(third["vs_tier_leader_pct"]) > 20 and float(third["detectable_pct"]) < 1
    # not ranked: its status, reason and accuracy, no time a grade book could take for a trusted one
    assert (wrong["rank"], wrong["op_time_sum_ms"], wrong["forward_ms"], wrong["status"], wrong["points"]) == (
        "", "", "", "incorrect", "0")
    assert wrong["reason"] == REASONS["incorrect"] and float(wrong["accuracy"]) == pytest.approx(0.1)


def test_the_html_page_is_written_whole(course_url, tmp_path):
    boards = leaderboard(course_url, EXPERIMENT)
    page = tmp_path / "board.html"
    write_html(page, boards, experiment=EXPERIMENT)
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.endswith("</html>\n")
    assert f"<title>Leaderboard: {EXPERIMENT}</title>" in html
    assert html.count("<table>") == 3 + 1  # a ranked table per board, one board with runs not ranked
    assert A100 in html and H100 in html and REASONS["suspect"] in html  # reasons whole, not cut
    assert [p.name for p in tmp_path.iterdir()] == ["board.html"]  # no temporary file left beside it


def test_the_terminal_table_cuts_long_reasons(course_url):
    table = render(leaderboard(course_url, EXPERIMENT))
    assert f"## {EXPERIMENT} · {H100} · b10000 s1 pageable" in table.splitlines()
    assert REASONS["suspect"] not in table and REASONS["suspect"][:60] in table


def test_an_experiment_without_runs_is_an_error(course_url):
    with pytest.raises(ConvsweepError, match=r"^leaderboard: no GPU run of experiment 'nope' is stored"):
        leaderboard(course_url, "nope")
    with pytest.raises(ConvsweepError, match="--threshold must be 0 or more"):
        leaderboard(course_url, threshold=-0.1)


def parse(*argv):
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    return parser.parse_args(["leaderboard", *argv])


def test_the_command_prints_csv_and_writes_the_page(course_url, tmp_path, capsys):
    assert parse().threshold == DEFAULT_THRESHOLD  # written out in the parser, so it loads no database code
    (tmp_path / "points.yaml").write_text(POINTS_YAML)
    args = parse("--db", course_url, "--experiment", EXPERIMENT, "--format", "csv",
                 "--points", str(tmp_path / "points.yaml"), "--html", str(tmp_path / "page.html"))
    args.func(args)
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == ",".join(CSV_COLUMNS) and len(out.splitlines()) == 1 + 12
    assert err == f"leaderboard: wrote {tmp_path / 'page.html'}\n"
    assert (tmp_path / "page.html").read_text().endswith("</html>\n")


# -- the tier rule against samples made to beat it (no database) -------------------------------------------------

_run_ids = itertools.count(1)


def entries(**samples_by_name):
    """Entries named by keyword, each its samples' median and spread, and the samples by run id."""
    made, samples = [], {}
    for name, values in samples_by_name.items():
        run_id = next(_run_ids)
        values = [float(v) for v in values]
        samples[run_id] = values
        made.append(Entry(name, run_id, f"{name}__v", None, "ok", "full", None, None, median(values), None, None,
                          samples=len(values), spread=relative_spread(values) if values else None))
    return made, samples


def tiered(**samples_by_name):
    made, samples = entries(**samples_by_name)
    return {e.submission: e for e in tiers(made, samples)}, samples


def test_a_tie_chain_is_anchored_at_the_tier_leader():
    """A ~ B and B ~ C, but A < C: B shares A's tier, C starts the next though B cannot be told from it. Anchored at
    the leader, a chain of small steps never carries a slower submission into the leader's tier."""
    rng = np.random.default_rng(1)
    got, samples = tiered(a=rng.normal(100, 0.5, 30), b=rng.normal(104, 0.5, 30), c=rng.normal(108, 0.5, 30))
    assert [(name, e.tier, e.rank) for name, e in got.items()] == [("a", 1, 1), ("b", 1, 1), ("c", 2, 3)]
    a, b, c = (samples[got[name].run_id] for name in "abc")
    assert bootstrap_ratio(b, c)[1] <= 1 + DEFAULT_THRESHOLD  # C cannot be told from B ...
    assert bootstrap_ratio(a, b)[1] <= 1 + DEFAULT_THRESHOLD < bootstrap_ratio(a, c)[1]  # ... but from A it can
    assert got["c"].against == "a"


def test_identical_medians_with_different_spreads_share_a_tier_the_steadier_first():
    steady = [100 + d for d in (-0.2, -0.1, 0, 0.1, 0.2) * 4 + (0,)]
    shaky = [100 + d for d in (-30, -15, 0, 15, 30) * 4 + (0,)]
    got, _ = tiered(shaky=shaky, steady=steady)
    assert median(steady) == median(shaky) == 100
    assert list(got) == ["steady", "shaky"]  # ties in median: the less noisy leads
    assert (got["shaky"].tier, got["shaky"].rank, got["shaky"].ratio) == (1, 1, 1.0)
    assert got["shaky"].detectable > DEFAULT_THRESHOLD > got["steady"].detectable
    assert got["shaky"].reason.startswith("noisy: its samples tell no difference under ±")
    assert got["steady"].reason == ""


def test_one_or_two_samples_never_lead_nor_take_a_rank():
    """Too few samples to tell anything: the fastest median of one sample does not lead tier 1, and three times the
    leader's median in two samples is not given the leader's rank either."""
    rng = np.random.default_rng(2)
    got, _ = tiered(lucky=[50.0], leader=rng.normal(100, 1, 20), near=rng.normal(101, 1, 20), slow=[300.0, 310.0])
    assert list(got) == ["lucky", "leader", "near", "slow"]
    assert [(got[n].tier, got[n].rank) for n in got] == [(None, None), (1, 1), (1, 1), (None, None)]
    assert got["lucky"].reason == "1 sample: too few to tell apart from any other (at least 5 to be tiered)"
    assert got["slow"].reason.startswith("2 samples: too few")
    assert got["near"].against == "leader"


def test_noise_can_hide_a_slower_submission_and_says_so():
    """A submission 20% slower whose passes spread evenly over ±80% of its median cannot be told from the leader: it
    shares tier 1, and its note and ± detectable, wider than the gap, say why."""
    rng = np.random.default_rng(3)
    got, _ = tiered(leader=rng.normal(100, 1, 30), scattered=120 * (1 + np.linspace(-0.8, 0.8, 31)))
    scattered = got["scattered"]
    assert (scattered.tier, scattered.rank) == (1, 1) and scattered.ratio == pytest.approx(1.2, rel=0.02)
    assert scattered.low <= 1 + DEFAULT_THRESHOLD and scattered.detectable > scattered.ratio - 1
    assert scattered.reason.startswith("noisy: its samples tell no difference under ±")


def test_a_threshold_of_zero_splits_at_any_difference_the_samples_see():
    rng = np.random.default_rng(4)
    made, samples = entries(a=rng.normal(100, 0.2, 30), b=rng.normal(102, 0.2, 30))
    assert [e.tier for e in tiers(made, samples, threshold=0.0)] == [1, 2]
    made, samples = entries(a=rng.normal(100, 0.2, 30), b=rng.normal(102, 0.2, 30))
    assert [e.tier for e in tiers(made, samples)] == [1, 1]  # within the default 5%
