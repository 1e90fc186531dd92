"""`convsweep leaderboard --confirm ROUNDS` (convsweep/analysis/tiers.py): each tier's top measured again, turn by
turn in processes of their own, alternating, and held to the next tier's top by a paired test. The rule on made-up
turns; then the command end to end on a stored course, each turn's `convsweep run-job` stood in for by a process
double that writes the result file a real one would."""
from __future__ import annotations

import csv
import io
import json
import re
import subprocess

import numpy as np
import pytest

from convsweep.analysis.leaderboard import leaderboard
from convsweep.analysis.tiers import confirm_boards, confirm_tops, tops_of, turn_orders
from convsweep.base.errors import ConvsweepError
from convsweep.base.strict_json import read_json
from convsweep.store import ingest_result, open_store
from leaderboard_fixtures import EXPERIMENT, H100, course_files, mark_timed_out
from store_fixtures import make_job_file, make_result
from test_leaderboard import board_of, parse


def turns(true_ms: dict[str, float], noise: float = 0.005, seed: int = 1, fail: frozenset[str] = frozenset()):
    """measure(i) over `names`: each top's true time with relative noise; the calls in order in `.calls`."""
    names = list(true_ms)
    rng = np.random.default_rng(seed)

    def measure(i):
        measure.calls.append(names[i])
        if names[i] in fail:
            return None, "failed: an illegal memory access was encountered"
        return true_ms[names[i]] * (1 + noise * rng.standard_normal()), None

    measure.calls = []
    return names, measure


def test_the_tops_alternate_forward_and_back():
    assert turn_orders(3, 4) == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    names, measure = turns({"a": 1.0, "b": 2.0})
    confirm_tops(names, 6, measure)
    assert measure.calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]


def test_clearly_separated_tops_are_confirmed_against_each_neighbour():
    names, measure = turns({"a": 10.0, "b": 13.0, "c": 17.0})
    found = confirm_tops(names, 6, measure)
    assert [f.confirmed for f in found] == [True, True, True]
    assert [f.order for f in found] == ["holds", "holds", None]
    assert re.fullmatch(r"confirmed: behind a \(\+3\.0\d\d ms, p 0\.031\); ahead of c \(-[34]\.\d{3} ms, p 0\.031\) "
                        r"\(6 turns\)", found[1].text), found[1].text
    assert found[0].median_ms == pytest.approx(10.0, rel=0.01)


def test_tops_the_turns_cannot_tell_apart_are_not_confirmed_and_say_what_it_would_take():
    names, measure = turns({"a": 10.0, "b": 10.01}, noise=0.02)
    a, b = confirm_tops(names, 6, measure)
    assert a.order == "not told apart" and a.confirmed is False and b.confirmed is False
    assert "not told apart from b" in a.text and "ms needed to tell" in a.text


def test_a_reversed_order_is_said():
    names, measure = turns({"a": 12.0, "b": 10.0})
    a, b = confirm_tops(names, 6, measure)
    assert a.order == "reversed" and not a.confirmed and "order reversed with b" in a.text
    assert "order reversed with a" in b.text


def test_a_top_whose_turns_fail_is_not_confirmed_with_the_reason_and_neither_is_its_neighbour():
    names, measure = turns({"a": 10.0, "b": 13.0}, fail=frozenset({"b"}))
    a, b = confirm_tops(names, 6, measure)
    assert b.turns_ms == [None] * 6
    assert b.text == "not confirmed: 0 of 6 turns measured (at least 6): failed: an illegal memory access was encountered"
    assert a.confirmed is False and "b gave too few turns" in a.text


def test_one_tier_has_no_order_to_confirm():
    names, measure = turns({"a": 10.0})
    (a,) = confirm_tops(names, 6, measure)
    assert a.confirmed is None and a.text.startswith("one tier: no order to confirm (6 turns")


@pytest.fixture()
def stored_course(db_url, tmp_path):
    """leaderboard_fixtures' course with every result file on disk where the store says it is."""
    engine = open_store(db_url)
    for n, job_file in enumerate(course_files()):
        path = tmp_path / f"result-{n}.json"
        path.write_text(json.dumps(job_file))
        ingest_result(engine, job_file, str(path))
    mark_timed_out(engine)
    engine.dispose()
    return db_url


def test_only_boards_of_this_machines_gpu_model_are_measured(stored_course):
    boards = leaderboard(stored_course, EXPERIMENT)
    calls = []
    said = confirm_boards(boards, 6, lambda board, entry: (calls.append(board.gpu), (1.0, None))[1], [H100])
    assert set(calls) == {H100}
    a100 = [b for b in boards if b.gpu != H100]
    assert a100 and all(top.confirmation.startswith("not confirmed: ranked on NVIDIA A100")
                        for b in a100 for top in tops_of(b.ranked))
    assert any("not confirmed here (this machine has NVIDIA H100 80GB HBM3)" in line for line in said)
    with pytest.raises(ConvsweepError, match=r"at least 6 rounds \(over fewer, the paired test cannot reach p < 0.05\)"):
        confirm_boards(boards, 5, lambda board, entry: (1.0, None), [H100])


def fake_run_job(times_ms: dict[str, float], seen: list[dict]):
    """subprocess.run standing in for `convsweep run-job`: reads the spec it is given and writes the result file a
    run-job of that setting would, its op time the submission's time (conv1 and conv2 split 2:3)."""
    rng = np.random.default_rng(7)
    real = subprocess.run

    def run(command, *args, **kwargs):
        if "run-job" not in command:
            return real(command, *args, **kwargs)
        spec = read_json(command[command.index("--spec-file") + 1])
        seen.append(spec)
        variant = spec["variants"]["conv1"]
        total = times_ms[variant.split("__")[0]] * (1 + 0.002 * rng.standard_normal())
        result = make_result(variant, spec["batch"], op_time_ms=(0.4 * total, 0.6 * total), experiment=EXPERIMENT)
        out = command[command.index("--out") + 1]
        with open(out, "w") as f:
            json.dump(make_job_file([result]), f)
        return subprocess.CompletedProcess(command, 0)

    return run


def test_the_command_confirms_the_tops_in_processes_of_their_own(stored_course, tmp_path, monkeypatch, capsys):
    """The course's H100 board at batch 10000 has two tiers (s01 and s02 in the first, s03 leading the second):
    their tops, s01 and s03, measured again six times each through run-job's command line, each turn on the
    stored setting with 5 timed passes, and the CSV says both held."""
    seen: list[dict] = []
    monkeypatch.setattr(subprocess, "run", fake_run_job({"s01": 70.0, "s03": 90.0}, seen))
    monkeypatch.setattr("convsweep.device.provenance.probe_machine",
                        lambda devices: type("M", (), {"gpu_names": (H100,)})())
    args = parse("--db", stored_course, "--experiment", EXPERIMENT, "--format", "csv", "--confirm", "6",
                 "--confirm-dir", str(tmp_path / "turns"))
    args.func(args)
    out, err = capsys.readouterr()
    rows = {(r["gpu"], r["batch"], r["submission"]): r for r in csv.DictReader(io.StringIO(out))}
    s01, s03 = rows[(H100, "10000", "s01")], rows[(H100, "10000", "s03")]
    assert s01["confirmed"] == "yes", s01
    assert re.fullmatch(r"confirmed: ahead of s03 \(-(19\.9|20\.0)\d\d ms, p 0\.031\) \(6 turns\)", s01["confirmation"])
    assert s03["confirmed"] == "yes" and "behind s01" in s03["confirmation"]
    assert rows[(H100, "10000", "s02")]["confirmed"] == ""  # in s01's tier, not its top
    assert {spec["repeats"] for spec in seen} == {5} and len(seen) == 6 * 2  # two tops at 10000
    assert rows[(H100, "1000", "s01")]["confirmation"] == "one tier: no order to confirm"  # nothing measured there
    at_10000 = [spec["variants"]["conv1"].split("__")[0] for spec in seen if spec["batch"] == 10000]
    assert at_10000[:4] == ["s01", "s03", "s03", "s01"] and {spec.get("checks", "full") for spec in seen} == {"full"}
    assert "2 tier tops measured again over 6 rounds, 2 confirmed" in err
    assert len(list((tmp_path / "turns").glob("turn-*.result.json"))) == len(seen)


def test_turns_that_write_no_result_leave_the_top_unconfirmed_with_run_jobs_last_line(stored_course, tmp_path,
                                                                                       monkeypatch):
    def broken(command, *args, stdout=None, **kwargs):
        stdout.write("convsweep: no CUDA device: this machine has no GPU\n")
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(subprocess, "run", broken)
    boards = leaderboard(stored_course, EXPERIMENT)
    from convsweep.app.commands.leaderboard import turn_runner

    confirm_boards([board_of(boards)], 6, turn_runner(stored_course, tmp_path, 5), [H100])
    top = tops_of(board_of(boards).ranked)[0]
    assert top.confirmed is False
    assert top.confirmation == ("not confirmed: 0 of 6 turns measured (at least 6): no result (convsweep: no CUDA "
                                "device: this machine has no GPU)")



def test_confirm_repeats_below_one_is_one_line_before_any_turn(stored_course, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no turn may run"))
    args = parse("--db", stored_course, "--experiment", EXPERIMENT, "--confirm", "6", "--confirm-repeats", "0")
    with pytest.raises(ConvsweepError, match=r"^leaderboard: --confirm-repeats must be 1 or more, got 0$"):
        args.func(args)
