"""`convsweep compare` end to end on stored runs, on SQLite and PostgreSQL."""
import json

import pytest

from convsweep.app.cli import main as cli_main
from convsweep.analysis.compare import SUSPECT, Selection, any_slower, compare, gate
from convsweep.base.errors import ConvsweepError
from convsweep.base.stats import FASTER, SAME, SLOWER
from convsweep.store import ingest_result, open_store

from store_fixtures import integrity_results, make_result
from test_stats import noisy


def test_selections_read_like_what_they_name(tmp_path):
    assert Selection.parse("7") == Selection("sweep", "7")
    assert Selection.parse("abc1234") == Selection("commit", "abc1234")
    assert Selection.parse(str(tmp_path)) == Selection("results", str(tmp_path))
    assert Selection.parse("lenet86-baseline") == Selection("experiment", "lenet86-baseline")
    assert Selection.parse("runs:3-9") == Selection("runs", "3-9")
    with pytest.raises(ConvsweepError, match="expected a run id, got 'x'"):
        Selection.parse("runs:x-9").condition("s")


def stored(variant: str, commit: str, op_time: list[float], **kwargs) -> dict:
    """A run whose conv layers add up to `op_time` per pass (conv1 40%, conv2 60%), each pass's
    forward 5 ms more, its copies."""
    result = make_result(variant, git={"commit": commit, "dirty": False}, **kwargs)
    result["samples"] = [
        {"metric": "op_time_ms", "layer": layer, "repeat": r, "value": share * v}
        for r, v in enumerate(op_time) for layer, share in (("conv1", 0.4), ("conv2", 0.6))
    ] + [{"metric": "forward_ms", "layer": None, "repeat": r, "value": v + 5.0} for r, v in enumerate(op_time)]
    return result


def test_compare_two_commits_job_by_job(db_url, capsys):
    engine = open_store(db_url)
    a, b = "a" * 40, "b" * 40
    for result in [
        stored("naive", a, noisy(40.0, 10, 0.003, 1)), stored("naive", b, noisy(40.0, 10, 0.003, 2)),
        stored("tiled", a, noisy(20.0, 10, 0.003, 3)), stored("tiled", b, noisy(23.0, 10, 0.003, 4)),
        # one setting on each side: the same job, though its tunable changed
        stored("fused", a, noisy(9.0, 10, 0.003, 5), params={"conv1": {"PR": 2}}),
        stored("fused", b, noisy(8.0, 10, 0.003, 6), params={"conv1": {"PR": 1}}),
        stored("im2col", a, noisy(30.0, 10, 0.003, 7)),  # measured at A only
        stored("naive", b, noisy(40.0, 10, 0.003, 8), status="incorrect"),  # never stands for a job
    ]:
        ingest_result(engine, result)
    engine.dispose()

    result = compare(db_url, f"commit:{a[:7]}", b[:12])
    verdicts = {row["variant"]: row["verdict"] for row in result["rows"]}
    assert verdicts == {"naive": SAME, "tiled": SLOWER, "fused": FASTER}
    assert result["only_a"] == 1 and result["only_b"] == 0
    tiled = next(row for row in result["rows"] if row["variant"] == "tiled")
    assert tiled["ratio"] == pytest.approx(23 / 20, rel=0.01) and tiled["samples_a"] == tiled["samples_b"] == 10
    assert next(row for row in result["rows"] if row["variant"] == "fused")["setting"] == "conv1 PR=2 -> conv1 PR=1"

    with pytest.raises(SystemExit) as exit_status:
        cli_main(["compare", a[:7], b[:7], "--db", db_url])
    assert exit_status.value.code == 1  # a SLOWER job fails CI
    table = capsys.readouterr().out
    assert "1 FASTER, 1 SAME, 1 SLOWER; 1 job only in A" in table and "| tiled" in table
    assert cli_main(["compare", a[:7], b[:7], "--db", db_url, "--threshold", "0.2", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {row["variant"]: row["verdict"] for row in data["rows"]}["tiled"] == SAME  # 15% is within 20%
    # One layer, or the whole pass (whose copies dilute the 15%: 25 ms -> 28 ms)
    conv2 = next(r for r in compare(db_url, a[:7], b[:7], metric="conv2")["rows"] if r["variant"] == "tiled")
    assert conv2["ratio"] == pytest.approx(1.15, rel=0.01) and conv2["verdict"] == SLOWER
    forward = next(r for r in compare(db_url, a[:7], b[:7], metric="forward_ms")["rows"] if r["variant"] == "tiled")
    assert forward["ratio"] == pytest.approx(28 / 25, rel=0.01)


def test_cpu_timed_jobs_are_left_out_unless_asked_for(db_url, capsys):
    """Two runs of one sweep on a shared host: the reference's host times moved 22% between them."""
    engine = open_store(db_url)
    a, b = "a" * 40, "b" * 40
    for commit, reference_ms, seed in ((a, 400.0, 1), (b, 488.0, 2)):
        ingest_result(engine, stored("reference", commit, noisy(reference_ms, 5, 0.003, seed), profiler="cpu"))
        ingest_result(engine, stored("naive", commit, noisy(40.0, 5, 0.003, seed + 2)))
    engine.dispose()

    result = compare(db_url, a[:7], b[:7])
    assert [row["variant"] for row in result["rows"]] == ["naive"] and result["cpu_left_out"] == 1
    assert cli_main(["compare", a[:7], b[:7], "--db", db_url]) == 0  # no SLOWER: the host, not the code
    assert "1 SAME; 1 CPU-timed job left out (host times: --cpu shows them)" in capsys.readouterr().out
    with_cpu = compare(db_url, a[:7], b[:7], cpu=True)
    assert {row["variant"]: row["verdict"] for row in with_cpu["rows"]} == {"naive": SAME, "reference": SLOWER}
    assert with_cpu["cpu_left_out"] == 0


def test_two_experiments_holding_the_same_cell_are_two_jobs(db_url):
    """The default sweep's batch-100 baseline (nsys) and its cache experiment's warm cell (events) are
    the same matrix cell: each is compared with itself, neither hides the other."""
    engine = open_store(db_url)
    a, b = "a" * 40, "b" * 40
    for commit, seed in ((a, 1), (b, 20)):
        ingest_result(engine, stored("naive", commit, noisy(40.0, 10, 0.003, seed), experiment="baseline"))
        ingest_result(engine, stored("naive", commit, noisy(55.0, 10, 0.003, seed + 1), experiment="cache"))
    engine.dispose()
    rows = compare(db_url, a[:7], b[:7])["rows"]
    assert sorted((row["experiment"], row["verdict"]) for row in rows) == [("baseline", SAME), ("cache", SAME)]


def test_a_selection_without_runs_is_one_line(db_url):
    engine = open_store(db_url)
    ingest_result(engine, stored("naive", "a" * 40, noisy(40.0, 10, 0.003, 1)))
    engine.dispose()
    with pytest.raises(ConvsweepError, match=r"^compare: sweep:99 selects no ok or suspect run in the database$"):
        compare(db_url, "99", "a" * 7)


def one_sweep(url: str, results_dir: str, tiled_op_time: float, seed: int) -> None:
    """A database holding one sweep of naive, tiled and im2col, its results kept under `results_dir`."""
    engine = open_store(url)
    for i, (variant, op_time) in enumerate((("naive", 40.0), ("tiled", tiled_op_time), ("im2col", 30.0))):
        ingest_result(engine, stored(variant, "a" * 40, noisy(op_time, 10, 0.003, seed + i)),
                      result_path=f"{results_dir}/{variant}.json")
    engine.dispose()


def test_b_from_a_database_of_its_own(tmp_path, capsys):
    db1, db2 = f"sqlite:///{tmp_path / 'm1.sqlite'}", f"sqlite:///{tmp_path / 'm2.sqlite'}"
    one_sweep(db1, "/m1/results", 20.0, 1)
    one_sweep(db2, "/m2/results", 23.0, 10)  # the same run ids as db1's: samples must come from B's file

    result = compare(db1, "results:/m1/results", "results:/m2/results", db_b=db2)
    assert {row["variant"]: row["verdict"] for row in result["rows"]} == {"naive": SAME, "tiled": SLOWER,
                                                                          "im2col": SAME}
    tiled = next(row for row in result["rows"] if row["variant"] == "tiled")
    assert tiled["ratio"] == pytest.approx(23 / 20, rel=0.01)
    assert (result["db_a"], result["db_b"]) == (db1, db2)
    with pytest.raises(ConvsweepError, match=r"^compare: results:/m2/results selects no ok or suspect run in the database$"):
        compare(db1, "results:/m1/results", "results:/m2/results")  # B's selection is not in A's database

    with pytest.raises(SystemExit) as exit_status:
        cli_main(["compare", "results:/m1/results", "results:/m2/results", "--db", db1, "--db-b", db2])
    assert exit_status.value.code == 1
    table = capsys.readouterr().out
    assert table.startswith(f"A from {db1}, B from {db2}\nA = results:/m1/results, B = results:/m2/results: "
                            "2 SAME, 1 SLOWER")
    assert cli_main(["compare", "results:/m1/results", "results:/m1/results", "--db", db1]) == 0
    assert capsys.readouterr().out.startswith("A = results:/m1/results")  # one database: no line for it


def test_a_missing_database_for_b_is_one_line_naming_it(tmp_path, capsys):
    db1, missing = f"sqlite:///{tmp_path / 'm1.sqlite'}", tmp_path / "elsewhere.sqlite"
    one_sweep(db1, "/m1/results", 20.0, 1)
    assert cli_main(["compare", "results:/m1/results", "results:/m1/results", "--db", db1,
                     "--db-b", f"sqlite:///{missing}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"convsweep: compare: B's database: no database at {missing}: run a sweep first"]


def two_commits(url: str, jobs_a: list[dict], jobs_b: list[dict]) -> None:
    engine = open_store(url)
    for result in jobs_a + jobs_b:
        ingest_result(engine, result)
    engine.dispose()


def test_no_job_in_both_is_an_error_not_a_pass(db_url, capsys):
    """A CI gate comparing two selections that share no job must fail, not pass on nothing."""
    a, b = "a" * 40, "b" * 40
    two_commits(db_url, [stored("naive", a, noisy(40.0, 5, 0.003, 1))],
                [stored("tiled", b, noisy(20.0, 5, 0.003, 2)), stored("im2col", b, noisy(30.0, 5, 0.003, 3))])
    message = "compare: no job of A is in B: nothing compared (1 only in A, 2 only in B)"
    with pytest.raises(ConvsweepError) as caught:
        compare(db_url, a[:7], b[:7])
    assert str(caught.value) == message
    assert cli_main(["compare", a[:7], b[:7], "--db", db_url]) == 2
    assert capsys.readouterr().err == f"convsweep: {message}\n"


def test_only_cpu_timed_jobs_in_both_is_an_error_that_names_cpu(db_url):
    a, b = "a" * 40, "b" * 40
    two_commits(db_url, [stored("reference", a, noisy(400.0, 5, 0.003, 1), profiler="cpu")],
                [stored("reference", b, noisy(400.0, 5, 0.003, 2), profiler="cpu")])
    with pytest.raises(ConvsweepError, match=r"^compare: every job of A in B is timed on the CPU \(1\): nothing "
                                             r"compared \(--cpu compares them\)$"):
        compare(db_url, a[:7], b[:7])
    assert [row["variant"] for row in compare(db_url, a[:7], b[:7], cpu=True)["rows"]] == ["reference"]


def test_an_unknown_metric_lists_the_ones_there_are(db_url, capsys):
    a, b = "a" * 40, "b" * 40
    two_commits(db_url, [stored("naive", a, noisy(40.0, 5, 0.003, 1))], [stored("naive", b, noisy(40.0, 5, 0.003, 2))])
    message = "compare: unknown --metric 'nosuch': expected one of op_time, forward_ms, conv1, conv2"
    with pytest.raises(ConvsweepError) as caught:
        compare(db_url, a[:7], b[:7], metric="nosuch")
    assert str(caught.value) == message
    assert cli_main(["compare", a[:7], b[:7], "--db", db_url, "--metric", "op_time_ms"]) == 2
    assert "unknown --metric 'op_time_ms': expected one of op_time, forward_ms, conv1, conv2" in capsys.readouterr().err
    assert compare(db_url, a[:7], b[:7], metric="conv1")["rows"][0]["samples_a"] == 5


@pytest.mark.parametrize("a, b, message", [
    ("", "", "compare: A: empty selection: expected latest, previous, sweep:N, commit:SHA, rev:REVISION (HEAD~1, a "
             "branch), experiment:NAME, results:DIR or runs:LO-HI (or the bare value)"),
    ("aaaaaaa", "  ", "compare: B: empty selection: expected latest, previous, sweep:N, "),
    ("aaaaaaa", "commit:", "compare: B: empty selection 'commit:': expected latest, previous, "),  # else every run
])
def test_an_empty_selection_is_one_line_saying_what_is_expected(db_url, a, b, message):
    two_commits(db_url, [stored("naive", "a" * 40, noisy(40.0, 5, 0.003, 1))], [])
    with pytest.raises(ConvsweepError) as caught:
        compare(db_url, a, b)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_previous_and_latest_select_per_job_and_are_the_default(db_url, capsys):
    """After an edit and a rerun, `convsweep compare` alone holds each job's newest measurement against
    the one before it: no ids to look up. A job measured once is only in latest; an incorrect run never
    stands for a job."""
    engine = open_store(db_url)
    for result in [
        stored("naive", "a" * 40, noisy(40.0, 10, 0.003, 1)), stored("tiled", "a" * 40, noisy(20.0, 10, 0.003, 2)),
        stored("naive", "a" * 40, noisy(40.0, 10, 0.003, 3)),  # rerun, unchanged
        stored("tiled", "a" * 40, noisy(26.0, 10, 0.003, 4)),  # rerun after an edit: slower
        stored("tiled", "a" * 40, noisy(10.0, 10, 0.003, 5), status="incorrect"),
        stored("fused", "a" * 40, noisy(9.0, 10, 0.003, 6)),  # measured once
    ]:
        ingest_result(engine, result)
    engine.dispose()
    assert Selection.parse("latest") == Selection("latest", "") and str(Selection.parse("previous")) == "previous"
    result = compare(db_url, "previous", "latest")
    assert {row["variant"]: row["verdict"] for row in result["rows"]} == {"naive": SAME, "tiled": SLOWER}
    assert result["only_a"] == 0 and result["only_b"] == 1
    with pytest.raises(SystemExit) as exit_status:
        cli_main(["compare", "--db", db_url])
    assert exit_status.value.code == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == ["compare: previous -> latest: each job's newest measurement against the one before it",
                                "compare: gate --fail-on slower: failed: 1 SLOWER"]
    assert "1 SAME, 1 SLOWER; 1 job only in B" in out


def test_compare_alone_after_one_sweep_says_there_is_nothing_before_the_newest_and_what_to_do(db_url, capsys):
    """After the first sweep every job has one measurement: `convsweep compare` said only that `previous`
    selects no run. An empty database still says just that."""
    open_store(db_url).dispose()
    with pytest.raises(ConvsweepError, match=r"^compare: previous selects no ok or suspect run in the database$"):
        compare(db_url, "previous", "latest")
    two_commits(db_url, [stored("naive", "a" * 40, noisy(40.0, 10, 0.003, 1)),
                         stored("tiled", "a" * 40, noisy(20.0, 10, 0.003, 2)),
                         stored("tiled", "a" * 40, noisy(10.0, 10, 0.003, 3), status="incorrect")], [])
    said = ("compare: every job in the database has one measurement only (2 jobs): nothing before the newest to "
            "compare with: run the sweep again after an edit, or compare two selections (`convsweep compare A B`)")
    with pytest.raises(ConvsweepError) as caught:
        compare(db_url, "previous", "latest")
    assert str(caught.value) == said
    assert cli_main(["compare", "--db", db_url]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "compare: previous -> latest: each job's newest measurement against the one before it", f"convsweep: {said}"]


def test_a_git_revision_selects_the_runs_measured_at_its_commit(db_url, tmp_path, monkeypatch):
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    for n in (1, 2):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", f"edit {n}")
    first, second = git("rev-parse", "HEAD~1"), git("rev-parse", "HEAD")
    two_commits(db_url, [stored("tiled", first, noisy(20.0, 10, 0.003, 1))],
                [stored("tiled", second, noisy(30.0, 10, 0.003, 2))])
    monkeypatch.chdir(tmp_path)
    assert Selection.parse("HEAD~1") == Selection("commit", first) == Selection.parse("rev:HEAD^")
    assert [row["verdict"] for row in compare(db_url, "HEAD~1", "HEAD")["rows"]] == [SLOWER]
    with pytest.raises(ConvsweepError, match=r"^compare: A: 'HEAD~5' names no commit of a git repository here$"):
        compare(db_url, "HEAD~5", "HEAD")


def test_a_suspect_measurement_is_shown_as_such_and_never_counted_faster(db_url, capsys):
    """naive re-measured and now suspect (ten times faster, below its floor): SUSPECT with its reason, not
    FASTER; tiled re-measured with fast checks: compared, and noted."""
    judged = next(m for job_file in integrity_results() for m in job_file["measurements"] if m["status"] == "suspect")
    fast = next(m for job_file in integrity_results() for m in job_file["measurements"]
                if m["integrity"]["checks"] == "fast")["integrity"]
    a, b = "a" * 40, "b" * 40
    two_commits(db_url, [stored("naive", a, noisy(40.0, 10, 0.003, 1)), stored("tiled", a, noisy(20.0, 10, 0.003, 2))],
                [stored("naive", b, noisy(4.0, 10, 0.003, 3), status="suspect", error=judged["error"],
                        integrity=judged["integrity"]),
                 stored("tiled", b, noisy(20.0, 10, 0.003, 4), integrity=fast)])
    result = compare(db_url, a[:7], b[:7])
    rows = {row["variant"]: row for row in result["rows"]}
    assert {variant: row["verdict"] for variant, row in rows.items()} == {"naive": SUSPECT, "tiled": SAME}
    assert rows["naive"]["suspect"] == f"B suspect: {judged['error']}"
    assert rows["naive"]["ratio"] == pytest.approx(0.1, rel=0.01)  # shown, but no verdict of FASTER
    assert (rows["tiled"]["checks_a"], rows["tiled"]["checks_b"], rows["tiled"]["suspect"]) == (None, "fast", None)
    assert result["verdicts"] == {SAME: 1, SUSPECT: 1} and not any_slower(result)

    assert cli_main(["compare", a[:7], b[:7], "--db", db_url, "--fail-on", "slower"]) == 0
    table, said = capsys.readouterr()
    assert said.strip() == ("compare: gate --fail-on slower: passed; 1 SUSPECT job ignored (the integrity checks "
                            "doubt its times: `convsweep query failures` says why)")
    assert "1 SAME, 1 SUSPECT" in table and "| note" in table
    naive = next(line for line in table.splitlines() if "| naive " in line)
    assert "| SUSPECT " in naive and "| B suspect: conv1 took 0.05 ms, below the physical floor" in naive
    assert "| fast checks: B" in next(line for line in table.splitlines() if "| tiled " in line)
    # `convsweep compare` alone: naive's newest measurement is the suspect one, held against the one before
    assert {row["variant"]: row["verdict"] for row in compare(db_url, "previous", "latest")["rows"]} == {
        "naive": SUSPECT, "tiled": SAME}


@pytest.mark.parametrize("verdicts, fail_on, failed, said", [
    ({"SAME": 3}, "slower", False, "gate --fail-on slower: passed"),
    ({"SAME": 1, "SLOWER": 2, "UNSURE": 1}, "slower", True, "gate --fail-on slower: failed: 2 SLOWER"),
    ({"SAME": 1, "SLOWER": 2, "UNSURE": 1}, "unsure", True, "gate --fail-on unsure: failed: 2 SLOWER, 1 UNSURE"),
    ({"UNSURE": 1}, "slower", False, "gate --fail-on slower: passed"),
    ({"SLOWER": 1, "SUSPECT": 2}, "never", False, "gate --fail-on never: passed"),
    ({"SLOWER": 1, "SUSPECT": 2}, "slower", True, "gate --fail-on slower: failed: 1 SLOWER; 2 SUSPECT jobs ignored"),
])
def test_the_gate_fails_on_the_verdicts_asked_and_never_on_a_suspect_one(verdicts, fail_on, failed, said):
    assert gate({"verdicts": verdicts}, fail_on)[0] is failed
    assert gate({"verdicts": verdicts}, fail_on)[1].startswith(said)


def test_the_gate_at_the_command_line_exits_1_only_when_asked(db_url, capsys):
    a, b = "a" * 40, "b" * 40
    two_commits(db_url, [stored("tiled", a, noisy(20.0, 10, 0.003, 1))], [stored("tiled", b, noisy(30.0, 10, 0.003, 2))])
    with pytest.raises(SystemExit) as exit_status:
        cli_main(["compare", a[:7], b[:7], "--db", db_url, "--fail-on", "slower"])
    assert exit_status.value.code == 1
    assert capsys.readouterr().err.strip() == "compare: gate --fail-on slower: failed: 1 SLOWER"
    assert cli_main(["compare", a[:7], b[:7], "--db", db_url, "--fail-on", "never"]) == 0  # a look, not a gate
    out, err = capsys.readouterr()
    assert "1 SLOWER" in out and err == ""
    with pytest.raises(ConvsweepError, match="unknown --fail-on 'sometimes'"):
        gate({"verdicts": {}}, "sometimes")


def test_the_github_workflow_gates_with_a_compare_the_cli_accepts():
    """.github/workflows/gpu-regressions.yml: only where a GPU runner is declared, and its compare line is
    one this CLI parses, failing on SLOWER."""
    import shlex

    import yaml

    from convsweep.app.cli import build_parser
    from convsweep.base.paths import ROOT

    workflow = yaml.safe_load((ROOT / ".github/workflows/gpu-regressions.yml").read_text())
    gate_job = workflow["jobs"]["gate"]
    assert "vars.CONVSWEEP_GPU_RUNNER == 'true'" in gate_job["if"] and "gpu" in gate_job["runs-on"]
    line = next(step["run"] for step in gate_job["steps"] if "convsweep compare" in step.get("run", ""))
    words = shlex.split(line.split("|")[0])
    args = build_parser().parse_args(words[words.index(".venv/bin/convsweep") + 1:])
    assert (args.a, args.b, args.fail_on) == ("$BASE", "$HEAD", "slower")
