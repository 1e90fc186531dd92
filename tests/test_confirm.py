"""Winners confirmed (convsweep/measure/confirm.py) on the CPU: which settings are re-measured, the interleaved
rounds over a numpy GPU whose layer times are scripted, the verdicts, the file, its ingest and `query best`."""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from sqlalchemy import inspect

from convsweep.measure import confirm
from convsweep.sweep.config import JobSpec, RunSpec
from convsweep.measure.confirm import Candidate, ConfirmSpec, choose, judge, run_confirm_job
from convsweep.base.errors import MachineError
from convsweep.device.gpu import no_gpu
from convsweep.measure.job import run_job
from convsweep.analysis.query import run_query
from convsweep.measure.record import Measurement, ResultFile, Timings
from convsweep.store import ingest_files, ingest_result, migrate, open_store
from convsweep.base.strict_json import read_json

from fake_gpu import FAKE, FakeClock, FakeGpuNetwork
from store_fixtures import as_reader, every_layer, make_confirmation, make_job_file, make_result

SWEEP = {"experiment": "t", "config_hash": "h", "config_path": "x.yaml"}


def measured(mid: str, status: str = "ok", **op_time_ms) -> Measurement:
    spec = {"experiment": "t", "network": "networks/lenet86.yaml", "dataset": "mnist5k",
            "variants": {"conv1": "naive", "conv2": "naive"}, "batch": 8, "streams": 1, "host_memory": "pageable",
            "repeats": 2, "warmup": 1,
            "profiler": "events", "params": {"conv1": {"BLOCK": int(mid[1:])}, "conv2": {"BLOCK": int(mid[1:])}}}
    m = Measurement.new("job", RunSpec(**spec).run_key, spec, SWEEP, {}, {}, None)
    m.measurement_id, m.status, m.timings = mid, status, Timings(op_time_ms=op_time_ms)
    return m


def results(*measurements) -> list[ResultFile]:
    return [ResultFile(3, "job", None, None, SWEEP, None, measurements=list(measurements))]


def test_choose_takes_the_top_of_each_layer_among_correct_settings_only():
    found = choose(results(measured("b1", conv1=1.0, conv2=5.0), measured("b2", conv1=2.0, conv2=1.0),
                           measured("b3", conv1=3.0, conv2=2.0), measured("b4", "incorrect", conv1=0.1, conv2=0.1),
                           measured("b5", conv1=4.0, conv2=3.0)), top=2)
    assert [(c.measurement_id, c.first) for c in found] == [
        ("b1", {"conv1": (1, 1.0)}), ("b2", {"conv1": (2, 2.0), "conv2": (1, 1.0)}), ("b3", {"conv2": (2, 2.0)})]
    assert found[0].run.params["conv1"] == {"BLOCK": 1}


def test_choose_counts_a_layer_setting_once_at_its_fastest():
    """A grid that tunes each layer on its own measures one conv2 kernel beside several conv1 kernels: the
    conv2 ranking holds each conv2 setting once, so its top is three different kernels."""
    same_conv2 = [measured(f"b{i}", conv1=1.0 + i, conv2=2.0 + i / 100) for i in (1, 2, 3)]
    for m in same_conv2:
        m.spec["params"]["conv2"] = {"BLOCK": 64}
    found = choose(results(*same_conv2, measured("b4", conv1=9.0, conv2=2.5), measured("b5", conv1=9.5, conv2=2.6)),
                   top=3)
    conv2 = sorted((c.first["conv2"], c.measurement_id) for c in found if "conv2" in c.first)
    assert conv2 == [((1, 2.01), "b1"), ((2, 2.5), "b4"), ((3, 2.6), "b5")]


def candidate(mid: str, **first) -> Candidate:
    run = RunSpec(experiment="t", network="n", dataset="d", variants={"conv1": "naive"}, batch=8, streams=1,
                  host_memory="pageable", repeats=1, warmup=0, profiler="events", params={})
    return Candidate(mid, "job", run, first)


def noisy(centre: float, rounds: int = 30, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [centre * (1 + rng.gauss(0, 0.002)) for _ in range(rounds)]


def test_judge_names_the_winner_its_ties_and_an_overturned_first_ranking():
    cands = [candidate("a", conv1=(1, 1.00)), candidate("b", conv1=(2, 1.01)), candidate("c", conv1=(3, 1.02))]
    times = [{"conv1": noisy(1.10, seed=1)}, {"conv1": noisy(1.00, seed=2)}, {"conv1": noisy(1.0005, seed=3)}]
    [verdict] = judge(cands, times, ["ok"] * 3, [None] * 3)
    standing = {e.measurement_id: (e.place, e.standing) for e in verdict.entries}
    assert standing == {"b": (1, "winner"), "c": (2, "tied"), "a": (3, "slower")}
    assert verdict.overturned is True and verdict.layer_index == 0
    slower = next(e for e in verdict.entries if e.measurement_id == "a")
    assert slower.p_value < 0.05 and 0 < slower.detectable_ms < 0.01 and slower.difference_ms > 0.09


def test_judge_keeps_the_first_ranking_when_the_winner_holds_and_puts_a_wrong_setting_last():
    cands = [candidate("a", conv1=(1, 1.0)), candidate("b", conv1=(2, 1.1)), candidate("c", conv1=(3, 1.2))]
    times = [{"conv1": noisy(1.0)}, {"conv1": noisy(1.1)}, {"conv1": []}]
    [verdict] = judge(cands, times, ["ok", "ok", "incorrect"], [None, None, "max rel err 0.3"])
    assert [(e.measurement_id, e.standing) for e in verdict.entries] == [
        ("a", "winner"), ("b", "slower"), ("c", "incorrect")]
    assert verdict.overturned is False and verdict.entries[2].error == "max rel err 0.3"


# -- a confirm job over a numpy GPU -------------------------------------------------------------------
BLOCKS = [64, 128, 256]


class TimedByBlock(FakeGpuNetwork):
    """The fake network, each conv layer taking `ms[BLOCK]` (plus a little noise) between its events."""

    ms: dict[int, float] = {}

    def __init__(self, gpu, network, weights, plan, lanes, capacity):
        super().__init__(gpu, network, weights, plan, lanes, capacity)
        self.block = plan.params["conv1"]["BLOCK"]
        self.rng = random.Random(self.block)

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        marks: dict = {}
        super().enqueue(stream, lane, x, logits, n, marks, flush)
        for name, pairs in marks.items():
            for begin, end in pairs:  # stretch each pair to the scripted time, the later events with it
                end.t = begin.t + self.ms[self.block] * (1 + self.rng.gauss(0, 0.001))
                FakeClock.now = max(FakeClock.now, end.t)
            if events is not None:
                events.setdefault(name, []).extend(pairs)


TIMED = dataclasses.replace(FAKE, network=TimedByBlock)


def grid_job(**over) -> JobSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"},
                grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": BLOCKS}}],
                batch=8, streams=1, host_memory="pageable", repeats=3, warmup=1, profiler="events", sweep=SWEEP)
    return JobSpec(**{**base, **over})


@pytest.fixture
def measured_cell(tmp_path, monkeypatch):
    """A job of three settings measured as 64 < 128 < 256 in op time; the file it wrote."""
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.0, 128: 2.0, 256: 3.0})
    out = tmp_path / "runs" / "job.json"
    run_job(grid_job(), out, backend=TIMED)
    return out


def confirm_spec(result, top=2, rounds=12) -> ConfirmSpec:
    job = grid_job()
    return ConfirmSpec("t", job.winners_id, job.to_dict(), [str(result)], top, rounds)


def test_a_confirm_job_measures_the_top_settings_interleaved_and_writes_who_wins(measured_cell, tmp_path, monkeypatch):
    # The re-measurement reverses the first ranking of the top two: 128 now beats 64 on both layers.
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.5, 128: 1.2, 256: 3.0})
    order = []
    monkeypatch.setattr(TimedByBlock, "enqueue", lambda self, *a, _e=TimedByBlock.enqueue, **k:
                        (order.append(self.block), _e(self, *a, **k))[1])
    monkeypatch.setattr(TimedByBlock, "hold", lambda self, stream, flag: order.append(("hold", self.block)))
    out = tmp_path / "winners" / "w.json"
    written = run_confirm_job(confirm_spec(measured_cell), out, backend=TIMED)
    assert json.loads(out.read_text()) == json.loads(json.dumps(written))
    assert written["status"] == "ok" and written["rounds"] == 12
    assert [c["params"]["conv1"]["BLOCK"] for c in written["candidates"]] == [64, 128]  # 256 is not in the top 2
    # Each checked once, host to host; then A B A B ..., each pass behind a held stream.
    assert order == [64, 128] + [("hold", 64), 64, ("hold", 128), 128] * 12
    for verdict in written["layers"]:
        entries = {written["candidates"][[c["measurement_id"] for c in written["candidates"]].index(e["measurement_id"])]
                   ["params"]["conv1"]["BLOCK"]: e for e in verdict["entries"]}
        assert (entries[128]["standing"], entries[128]["first_place"]) == ("winner", 2)
        assert (entries[64]["standing"], entries[64]["first_place"]) == ("slower", 1)
        assert verdict["overturned"] is True and len(entries[64]["samples_ms"]) == 12
        assert entries[128]["median_ms"] == pytest.approx(1.2, rel=0.01)
    assert confirm.summary_lines(written)[0].endswith("(first ranking overturned)")


class MemoByBlock(TimedByBlock):
    """BLOCK 128 keeps its output by the input's bytes and serves a repeat in a tenth of its time: the confirmation
    that timed one batch again and again crowned it. Every round is new now: it never hits."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        kept = self.__dict__.setdefault("kept", {})
        key = self.gpu.read(x.rows(0, n)).tobytes()
        super().enqueue(stream, lane, x, logits, n, events, flush)
        if self.block == 128 and key in kept and events is not None:
            for pairs in events.values():
                for begin, end in pairs:
                    end.t = begin.t + (end.t - begin.t) / 10
        kept[key] = True


def test_every_confirmation_round_is_new_so_a_memo_gains_nothing(measured_cell, tmp_path, monkeypatch):
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.0, 128: 1.5, 256: 3.0})  # 128 served from a memo: 0.15
    written = run_confirm_job(confirm_spec(measured_cell, rounds=5), tmp_path / "w.json",
                              backend=dataclasses.replace(FAKE, network=MemoByBlock))
    assert written["freshness"]["counted"] == 5 and written["freshness"]["stale_rounds"] == 0
    assert len(written["inputs"]["seed"]) == 16
    for verdict in written["layers"]:
        winner = next(e for e in verdict["entries"] if e["standing"] == "winner")
        assert winner["median_ms"] == pytest.approx(1.0, rel=0.01) and not verdict["overturned"]


class WrongOnFreshRounds(TimedByBlock):
    """BLOCK 128 is right on the seeds' batch (round 0, where it was checked before the rounds) and off after."""

    def enqueue(self, stream, lane, x, logits, n, events=None, flush=None):
        super().enqueue(stream, lane, x, logits, n, events, flush)
        self.passes = getattr(self, "passes", 0) + 1
        if self.block == 128 and self.passes > 1:
            self.gpu.read(logits.rows(0, n))[...] *= 1.01


def test_a_setting_wrong_in_a_confirmation_round_is_incorrect_and_leaves_the_rounds(measured_cell, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.0, 128: 2.0, 256: 3.0})
    written = run_confirm_job(confirm_spec(measured_cell, rounds=4), tmp_path / "w.json",
                              backend=dataclasses.replace(FAKE, network=WrongOnFreshRounds))
    statuses = {c["params"]["conv1"]["BLOCK"]: (c["status"], c["error"]) for c in written["candidates"]}
    assert statuses[64] == ("ok", None)
    assert statuses[128][0] == "incorrect" and statuses[128][1].startswith("round 1: max relative error")


def test_a_cell_of_one_correct_setting_is_skipped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.0})
    out = tmp_path / "runs" / "job.json"
    job = grid_job(grid=[{"layers": ["conv1", "conv2"], "values": {"BLOCK": [64]}}])
    run_job(job, out, backend=TIMED)
    written = run_confirm_job(ConfirmSpec("t", job.winners_id, job.to_dict(), [str(out)], 3, 10), tmp_path / "w.json",
                              backend=TIMED)
    assert written["status"] == "skipped" and "nothing to tell apart" in written["reason"]


def no_gpu_here():
    raise no_gpu("no driver here")


def test_a_machine_without_a_gpu_leaves_no_confirm_file(measured_cell, tmp_path):
    out = tmp_path / "w.json"
    out.write_text("{}")  # an earlier attempt's: it must not stand as this one's result
    with pytest.raises(MachineError):
        run_confirm_job(confirm_spec(measured_cell), out, backend=dataclasses.replace(TIMED, gpu=no_gpu_here))
    assert not out.exists()


def test_the_confirm_file_is_stored_once_and_query_best_reports_the_confirmed_winner(measured_cell, tmp_path,
                                                                                      monkeypatch, db_url):
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.5, 128: 1.2, 256: 3.0})
    out = tmp_path / "winners" / "w.json"
    run_confirm_job(confirm_spec(measured_cell), out, backend=TIMED)
    engine = open_store(db_url)
    with pytest.raises(Exception, match="the runs it confirms are not stored"):
        ingest_result(engine, read_json(out), str(out))
    report = ingest_files(engine, [measured_cell, out])
    assert not report.errors and report.added == 3 + 4  # three runs, two layers × two settings
    assert ingest_files(engine, [out]).unchanged == 4
    engine.dispose()
    rows = json.loads(run_query(as_reader(db_url), "best", fmt="json"))
    got = [(r["layer"], r["standing"], json.loads(r["tunables"])["BLOCK"] if isinstance(r["tunables"], str)
            else r["tunables"]["BLOCK"], r["first place"]) for r in rows]
    assert got == [("op time 1", "confirmed", 128, 2), ("op time 2", "confirmed", 128, 2)]
    assert all(r["confirmed (ms)"] == pytest.approx(1.2, rel=0.01) and r["detectable (ms)"] > 0 for r in rows)


def test_query_best_falls_back_to_the_first_ranking_once_a_confirmed_setting_is_measured_again(
        measured_cell, tmp_path, monkeypatch, db_url):
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.5, 128: 1.2, 256: 3.0})
    out = tmp_path / "winners" / "w.json"
    run_confirm_job(confirm_spec(measured_cell), out, backend=TIMED)
    engine = open_store(db_url)
    ingest_files(engine, [measured_cell, out])
    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.0, 128: 2.0, 256: 3.0})
    again = tmp_path / "runs2" / "job.json"
    run_job(grid_job(), again, backend=TIMED)  # a newer measurement of every setting
    ingest_files(engine, [again])
    engine.dispose()
    rows = json.loads(run_query(as_reader(db_url), "best", fmt="json"))
    assert {r["standing"] for r in rows} == {"fastest"} and all(r["confirmed (ms)"] is None for r in rows)


def test_a_confirm_file_that_breaks_its_schema_is_one_line_naming_the_key(measured_cell, tmp_path, db_url):
    out = tmp_path / "w.json"
    run_confirm_job(confirm_spec(measured_cell), out, backend=TIMED)
    data = read_json(out)
    data["layers"][0]["entries"][0]["standing"] = "best"
    engine = open_store(db_url)
    report = ingest_files(engine, [measured_cell])
    with pytest.raises(Exception) as e:
        ingest_result(engine, data, str(out))
    engine.dispose()
    assert "standing" in str(e.value) and "\n" not in str(e.value) and not report.errors


def test_the_report_says_the_confirmation_overturned_the_first_ranking(measured_cell, tmp_path, monkeypatch, db_url):
    from convsweep import report
    from convsweep.base.document import to_markdown

    monkeypatch.setattr(TimedByBlock, "ms", {64: 1.5, 128: 1.2, 256: 3.0})
    out = tmp_path / "winners" / "w.json"
    run_confirm_job(confirm_spec(measured_cell), out, backend=TIMED)
    engine = open_store(db_url)
    ingest_files(engine, [measured_cell, out])
    engine.dispose()
    rows = json.loads(run_query(as_reader(db_url), "winners", fmt="json"))
    assert [(r["layer"], r["ranking"], r["first winner now"], r["tied"]) for r in rows] == [
        ("op time 1", "overturned", "slower", 0), ("op time 2", "overturned", "slower", 0)]
    text = to_markdown(report.build(report.load(db_url, "t")), tmp_path)
    assert "## Winners confirmed" in text and "overturned the first ranking** in 2 of 2" in text
    assert "`naive` BLOCK=128" in text


def speaking(engine) -> set[tuple[str, int]]:
    """(confirmation_id, run_id) of each row the view latest_confirmation holds."""
    with engine.connect() as connection:
        return set(connection.exec_driver_sql("SELECT confirmation_id, run_id FROM latest_confirmation").all())


def test_latest_confirmation_holds_each_cells_newest_while_its_runs_are_latest_and_goes_below_0017(db_url):
    """Migration 0017's view: of a cell's confirmations the newest, until a setting it measured is measured
    again; a downgrade to 0016 drops the view and keeps the confirmations, and upgrading makes it again."""
    cell = [make_result("naive", 100, params=every_layer(BLOCK=block), op_time_ms=(ms, 0.7))
            for block, ms in ((32, 0.3), (64, 0.4))]
    job = make_job_file(cell)
    older = make_confirmation(job, ms=(0.45, 0.35), standings=("slower", "winner"))
    newer = {**make_confirmation(job), "started_at": "2026-11-26T13:00:00.000+00:00"}
    engine = open_store(db_url)
    try:
        for document in (job, older, newer):
            ingest_result(engine, document, None)
        with engine.connect() as connection:
            runs = dict(connection.exec_driver_sql("SELECT measurement_id, id FROM run").all())
        assert speaking(engine) == {(newer["confirmation_id"], runs[m["measurement_id"]]) for m in cell}
        # BLOCK=64 measured again: the newest confirmation no longer speaks, and the older does not either.
        again = make_result("naive", 100, params=every_layer(BLOCK=64), op_time_ms=(0.4, 0.7),
                            started_at="2026-11-27T09:00:00+00:00")
        ingest_result(engine, again, None)
        assert speaking(engine) == set()

        migrate(engine, "0016", downgrade=True)
        with engine.connect() as connection:
            assert "latest_confirmation" not in inspect(connection).get_view_names()
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM confirmation").scalar() == 4
        migrate(engine, "head")
        with engine.connect() as connection:
            assert "latest_confirmation" in inspect(connection).get_view_names()
        assert speaking(engine) == set()
    finally:
        engine.dispose()


# -- the plan: which cells get a confirm job -------------------------------------------------------------
def test_the_default_sweep_confirms_each_one_stream_gpu_cell_of_several_settings(tmp_path):
    import copy

    import yaml

    from convsweep.base.paths import ROOT
    from convsweep.app.plan import SweepPlan

    config = yaml.safe_load((ROOT / "experiments.yaml").read_text())
    config["results_dir"] = str(tmp_path / "results")
    plan = SweepPlan(copy.deepcopy(config), ROOT / "experiments.yaml")
    groups = {e: plan.winner_groups(e) for e in plan.experiments}
    # baseline: a cell per batch (its six GPU variants; the CPU reference takes no part); cache: warm and cold;
    # input: four streams, whose events cannot split a pass into layers.
    assert [len(groups[e]) for e in ("lenet86-baseline", "lenet86-cache", "lenet86-input")] == [3, 2, 0]
    group = groups["lenet86-baseline"][0]
    spec = plan.winners_spec("lenet86-baseline", group)
    assert len(spec["results"]) == 6 and (spec["top"], spec["rounds"]) == (3, 30)
    assert all("/runs/reference" not in path for path in spec["results"])
    assert f"{tmp_path}/results/lenet86-baseline/winners" in plan.result_folders("lenet86-baseline")
    plan.write_specs()
    assert json.loads(Path(plan.winners_spec_file("lenet86-baseline", group)).read_text()) == spec

    for e in config["experiments"].values():
        e["confirm"] = {"top": 0}
    assert not any(SweepPlan(config, ROOT / "experiments.yaml").winner_groups(e) for e in plan.experiments)


HANGS = """
import os, time
fd = os.open(os.environ["CONVSWEEP_HEARTBEAT"], os.O_WRONLY | os.O_APPEND)
os.write(fd, b"setting 0\\npass \\n")
time.sleep(60)
"""


def test_a_confirmation_whose_pass_never_ends_is_killed_at_the_cells_deadline_and_says_so(measured_cell, tmp_path,
                                                                                         monkeypatch, capsys):
    """confirm-job is watched as run-job is: a worker hung in a pass is killed, and the file says not confirmed."""
    import argparse
    import sys

    from convsweep.app.commands import confirm_job as command

    job = grid_job(deadline_s=0.5)
    spec_file, out = tmp_path / "confirm.json", tmp_path / "winners" / "w.json"
    spec_file.write_text(json.dumps(ConfirmSpec("t", job.winners_id, job.to_dict(), [str(measured_cell)], 2,
                                                12).to_dict()))
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    monkeypatch.setattr(command, "worker_command", lambda args, *own: [sys.executable, str(script)])
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout")
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["confirm-job", "--spec-file", str(spec_file), "--out", str(out)])
    args.func(args)
    written = json.loads(out.read_text())
    assert written["status"] == "skipped" and written["candidates"] == []
    assert written["reason"].startswith("a pass ran past its 0.5 s deadline (`deadline_s`): killed")
    assert capsys.readouterr().out.startswith(f"{job.winners_id}: not confirmed: a pass ran past its 0.5 s deadline")
