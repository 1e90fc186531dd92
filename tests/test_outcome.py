"""The end of every `snakemake`: what each experiment stored, what did not finish, and why."""
import dataclasses
import io
import json
import logging
import os
import sys
import types
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from store_fixtures import integrity_results, make_result, write_results

from convsweep.base.errors import ConvsweepError
from convsweep.analysis.outcome import (FAILURES, REASON_CHARS, BriefFailures, ExperimentFiles, JobFiles, NotRun, finish_sweep,
                               last_reason, settings_not_ok)
from convsweep.store import ingest_files, open_store

NO_GPU = "no NVIDIA GPU or driver on this machine (cuInit: CUDA_ERROR_NO_DEVICE)"


def experiment_files(root: Path, finished: list[dict], unfinished: dict[str, str | None],
                     profiles: dict[str, dict] | None = None) -> ExperimentFiles:
    """Experiment `e` under root as the rules lay it out: a result file per finished job, and for each
    unfinished job its log's text (None: no log)."""
    runs, logs = root / "e" / "runs", root / "e" / "logs"
    write_results(runs, finished)
    logs.mkdir(parents=True, exist_ok=True)
    for job_id, log in unfinished.items():
        if log is not None:
            (logs / f"{job_id}.log").write_text(log)
    jobs = [JobFiles(job_id, runs / f"{job_id}.json", logs / f"{job_id}.log")
            for job_id in [r["job_id"] for r in finished] + list(unfinished)]
    for job_id, profile in (profiles or {}).items():
        (root / "e" / "ncu").mkdir(parents=True, exist_ok=True)
        (root / "e" / "ncu" / f"{job_id}.json").write_text(json.dumps(profile))
        jobs.append(JobFiles(job_id, root / "e" / "ncu" / f"{job_id}.json", logs / f"ncu-{job_id}.log", kind="profile"))
    return ExperimentFiles("e", jobs, root / "e" / "ingested.json",
                           [root / "e" / "summary.md", root / "e" / "report.md"], logs / "report.log")


def said(db_url: str, experiment: ExperimentFiles) -> str:
    out = io.StringIO()
    finish_sweep(db_url, [experiment], out=out)
    return out.getvalue()


def stored_statuses(db_url: str) -> list[str]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            return sorted(c.execute(text("SELECT status FROM run")).scalars())
    finally:
        engine.dispose()


def test_a_failed_job_leaves_the_others_stored_and_says_why(tmp_path, db_url):
    """Ingest never ran (a job failed): the results that were written are stored at the end, counted by
    status, and each reason is one row with its count, the failed jobs' from the last line of their logs."""
    finished = [make_result("naive", 100, experiment="e"), make_result("broken", 100, status="failed", experiment="e"),
                make_result("fp16", 100, status="incorrect", experiment="e")]
    log = f"naive-b1000: 1 of 1 valid settings\nconvsweep: an earlier line\nwarming up\nconvsweep: {NO_GPU}\n"
    experiment = experiment_files(tmp_path / "results", finished, {"naive-b1000-x": log, "naive-b10000-x": log,
                                                                   "tiled-b100-x": None})
    text_ = said(db_url, experiment)
    lines = text_.splitlines()
    assert lines[0] == "convsweep: e: 3 of 6 jobs finished; settings stored: 1 ok, 1 failed, 1 incorrect"
    rows = [line.split(None, 3) for line in lines[3:7]]
    assert rows == [["2", "jobs", "did", f"not finish  {NO_GPU}"],
                    ["1", "job", "did", "not finish  not started"],
                    ["1", "setting", "failed", "compile failed: tiled.cu(12): error: identifier TILE undefined"],
                    ["1", "setting", "incorrect", "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)"]]
    logs = tmp_path / "results" / "e" / "logs"
    assert lines[7] == f"  more: {logs / 'naive-b1000-x.log'} (and 1 more in {logs}); `convsweep query failures`"
    assert lines[8].startswith("  `snakemake` again retries what did not finish")
    assert len(lines) == 9
    assert stored_statuses(db_url) == ["failed", "incorrect", "ok"]

    said(db_url, experiment)  # told again: stored once (ingest is idempotent)
    assert stored_statuses(db_url) == ["failed", "incorrect", "ok"]


def test_a_finished_sweep_is_one_line_and_is_not_stored_again(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    experiment = experiment_files(tmp_path / "results", [make_result("naive", 100, experiment="e")], {})
    engine = open_store(db_url)
    ingest_files(engine, [job.result for job in experiment.jobs])
    engine.dispose()
    for path in [experiment.ingested, *experiment.reports]:
        path.write_text("made\n")
    os.utime(experiment.jobs[0].result, (1, 1))  # older than the ingest record: ingest_results stored it

    assert said(db_url, experiment) == ("convsweep: e: 1 of 1 jobs finished; settings stored: 1 ok, 0 failed, "
                                        f"0 incorrect; report: {experiment.reports[-1]}\n")


def test_a_result_that_cannot_be_stored_is_a_row_and_the_others_are_stored(tmp_path, db_url):
    finished = [make_result("naive", 100, experiment="e"), make_result("tiled", 100, experiment="e")]
    experiment = experiment_files(tmp_path / "results", finished, {})
    experiment.jobs[1].result.write_text('{"format": 2, "job_')
    lines = said(db_url, experiment).splitlines()
    assert lines[0] == "convsweep: e: 2 of 2 jobs finished; settings stored: 1 ok, 0 failed, 0 incorrect"
    assert lines[3].split(None, 4) == ["1", "job", "not", "stored", "not valid JSON: Unterminated string starting at: "
                                                                    "line 1 column 15 (char 14)"]
    assert lines[4] == f"  more: {experiment.jobs[1].result}"
    assert stored_statuses(db_url) == ["ok"]


def test_skipped_profiles_and_a_report_not_made_are_rows(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    skipped = {"format": "ncu-1", "status": "skipped", "reason": "ncu not found: install Nsight Compute or set $NCU"}
    experiment = experiment_files(tmp_path / "results", [make_result("naive", 100, experiment="e")], {},
                                  profiles={"naive-b100-p": skipped, "naive-b1000-p": skipped})
    engine = open_store(db_url)
    ingest_files(engine, [job.result for job in experiment.jobs])
    engine.dispose()
    experiment.ingested.write_text("{}")
    experiment.report_log.write_text("drawing\nconvsweep: no runs of experiment 'e' in the database\n")
    rows = [line.split(None, 2) for line in said(db_url, experiment).splitlines()[3:]]
    assert rows == [["1", "job", "report not made  no runs of experiment 'e' in the database"],
                    ["2", "jobs", "profile skipped  ncu not found: install Nsight Compute or set $NCU"]]


def test_a_database_that_cannot_be_read_is_one_line(tmp_path):
    (tmp_path / "db.sqlite").write_text("not a database")
    experiment = experiment_files(tmp_path / "results", [make_result("naive", 100, experiment="e")], {})
    out = said(f"sqlite:///{tmp_path / 'db.sqlite'}", experiment)
    assert out.count("\n") == 1
    assert out.startswith("convsweep: e: cannot tell what was stored: ") and "not an SQLite database" in out


def test_the_reason_is_the_logs_last_convsweep_line_cut_to_a_table_cell(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("convsweep: an early word\n" + "progress\r" * 20_000 + "\nconvsweep: " + "x" * 300 + "\ndone\n")
    assert last_reason(log) == "x" * 300
    experiment = experiment_files(tmp_path / "results", [], {"j": log.read_text()})
    row = said(f"sqlite:///{tmp_path / 'db.sqlite'}", experiment).splitlines()[3]
    assert row.endswith("x" * (REASON_CHARS - 1) + "…")
    log.write_text("killed\n")
    assert last_reason(log) is None and last_reason(tmp_path / "none.log") is None


WRITE_REPORT = ("import pathlib, sys\n"
                "for name in sys.argv[1:]:\n"
                "    pathlib.Path(name).write_text('reported')\n"
                "print('report written')\n")


def test_a_report_is_written_over_the_jobs_that_finished_and_only_when_it_is_out_of_date(tmp_path, db_url):
    """Some jobs did not finish: the report rule's command runs over what was stored, so summary.md exists and
    `snakemake --report` finds its files; a second end of sweep with nothing new leaves it alone."""
    finished = [make_result("naive", 100, experiment="e")]
    experiment = experiment_files(tmp_path / "results", finished, {"naive-b1000-x": f"convsweep: {NO_GPU}\n"})
    reports = [str(p) for p in experiment.reports]
    experiment = dataclasses.replace(experiment, report_command=[sys.executable, "-c", WRITE_REPORT, *reports])
    lines = said(db_url, experiment).splitlines()
    assert [Path(p).read_text() for p in reports] == ["reported", "reported"]
    assert f"  report over the 1 job that finished: {experiment.reports[-1]}" in lines
    assert experiment.report_log.read_text() == "report written\n"
    experiment.report_log.unlink()
    said(db_url, experiment)
    assert not experiment.report_log.exists()  # up to date: not written again


def test_a_report_that_fails_is_a_row_of_the_table(tmp_path, db_url):
    experiment = experiment_files(tmp_path / "results", [make_result("naive", 100, experiment="e")],
                                  {"naive-b1000-x": f"convsweep: {NO_GPU}\n"})
    failing = "import sys; print('convsweep: cannot draw: no space'); sys.exit(2)"
    experiment = dataclasses.replace(experiment, report_command=[sys.executable, "-c", failing])
    rows = [line.split(None, 3) for line in said(db_url, experiment).splitlines()]
    assert ["1", "job", "report", "not made  cannot draw: no space"] in rows


def test_a_finished_experiment_is_not_reported_at_the_end(tmp_path, db_url):
    experiment = experiment_files(tmp_path / "results", [make_result("naive", 100, experiment="e")], {})
    experiment = dataclasses.replace(experiment, report_command=[sys.executable, "-c", "raise SystemExit(3)"])
    said(db_url, experiment)
    assert not experiment.report_log.exists()  # the make_report rule reports it


def test_suspect_settings_are_counted_and_each_reason_is_a_row(tmp_path, db_url):
    """A sweep whose stored settings include a suspect one does not end as if all were well: the count names it,
    its reason is a row, and the settings measured with fast checks are said."""
    experiment = experiment_files(tmp_path / "results", integrity_results(), {})
    experiment = dataclasses.replace(experiment, name="lenet86-integrity")  # the fixtures' experiment
    lines = said(db_url, experiment).splitlines()
    assert lines[0] == ("convsweep: lenet86-integrity: 2 of 2 jobs finished; settings stored: 2 ok, 1 suspect, "
                        "0 failed, 0 incorrect (1 measured with fast checks: no caching test)")
    count, unit, what, why = lines[3].split(None, 3)
    assert (count, unit, what) == ("1", "setting", "suspect")
    assert why.startswith("conv1 took 0.05 ms, below the physical floor") and len(why) == REASON_CHARS
    assert lines[4] == "  more: `convsweep query failures`"
    assert stored_statuses(db_url) == ["ok", "ok", "suspect"]


def test_a_confirmation_that_waits_for_its_cell_or_failed_is_a_row_of_its_own(tmp_path, db_url):
    """A confirm job is neither a job of the matrix nor a profile: it is not counted among the jobs, and
    where it did not run (its cell's jobs did not all finish) or failed, a row says so and why."""
    finished = [make_result("naive", 100, experiment="e")]
    experiment = experiment_files(tmp_path / "results", finished, {"tiled-b100-x": f"convsweep: {NO_GPU}\n"})
    logs = tmp_path / "results" / "e" / "logs"
    (logs / "winners-b1000-s1-0123456789.log").write_text(f"convsweep: {NO_GPU}\n")
    experiment.jobs.extend(JobFiles(group, tmp_path / "results" / "e" / "winners" / f"{group}.json",
                                    logs / f"{group}.log", kind="winners")
                           for group in ("winners-b100-s1-0123456789", "winners-b1000-s1-0123456789"))
    lines = said(db_url, experiment).splitlines()
    assert lines[0].startswith("convsweep: e: 1 of 2 jobs finished")
    assert [" ".join(line.split()) for line in lines[3:6]] == [f"1 job did not finish {NO_GPU}",
                                                              "1 job winners not confirmed waits for its cell's jobs",
                                                              f"1 job winners not confirmed {NO_GPU}"]


def test_each_reason_points_at_a_log_of_a_job_that_stopped_for_it(tmp_path, db_url):
    """Two reasons, each with its logs: a `more` line per reason names one of its own jobs' logs (the table used to
    name the first log of all, whatever its reason)."""
    nsys = "profiler: nsys asked for but nsys is not on PATH or $NSYS"
    experiment = experiment_files(tmp_path / "results", [], {"a-b100-x": f"convsweep: {nsys}\n",
                                                             "b-b100-x": f"convsweep: {NO_GPU}\n",
                                                             "c-b100-x": f"convsweep: {NO_GPU}\n"})
    lines = said(db_url, experiment).splitlines()
    logs = tmp_path / "results" / "e" / "logs"
    assert [" ".join(line.split()) for line in lines[3:5]] == [f"2 jobs did not finish {NO_GPU}",
                                                              f"1 job did not finish {nsys}"]
    assert lines[5:7] == [f"  more on did not finish, no NVIDIA GPU or driver on this machine…: "
                          f"{logs / 'b-b100-x.log'} (and 1 more in {logs})",
                          f"  more on did not finish, profiler: nsys asked for but nsys is no…: "
                          f"{logs / 'a-b100-x.log'}"]


def test_jobs_the_machine_left_out_are_rows_with_their_record_and_the_sweep_says_what_runs_them(tmp_path, db_url):
    finished = [make_result("reference", 100, experiment="e")]
    experiment = experiment_files(tmp_path / "results", finished, {"naive-b100-x": None})
    record = tmp_path / "results" / "e" / "not-run.json"
    NotRun(NO_GPU, (("run", "naive-b100-x"), ("profile", "naive-b100-x"))).write(record)
    assert NotRun.read(record) == NotRun(NO_GPU, (("run", "naive-b100-x"), ("profile", "naive-b100-x")))
    logs = tmp_path / "results" / "e" / "logs"
    experiment = dataclasses.replace(
        experiment, not_run_file=record,
        jobs=[dataclasses.replace(experiment.jobs[0]),
              dataclasses.replace(experiment.jobs[1], not_run=NO_GPU),
              JobFiles("naive-b100-x", tmp_path / "results" / "e" / "ncu" / "naive-b100-x.json",
                       logs / "ncu-naive-b100-x.log", kind="profile", not_run=NO_GPU)])
    out = io.StringIO()
    assert finish_sweep(db_url, [experiment], out=out, cpu_sweep="snakemake --configfile sweeps/cpu.yaml") == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "convsweep: e: 1 of 2 jobs finished; settings stored: 1 ok, 0 failed, 0 incorrect"
    assert [" ".join(line.split()) for line in lines[3:5]] == [f"1 job not run {NO_GPU}",
                                                              f"1 job profile not run {NO_GPU}"]
    assert lines[5] == f"  more: {record}"
    assert not any("retries" in line for line in lines)  # `snakemake` again here would not run them
    assert lines[-1] == ("convsweep: 2 jobs were not run: `snakemake` on a machine with an NVIDIA GPU runs them; "
                         "`snakemake --configfile sweeps/cpu.yaml` runs the CPU sweep alone")
    record.write_text('{"format": "something-else"}')
    with pytest.raises(ConvsweepError, match="not-run.json: expected a not-run-1 record"):
        NotRun.read(record)
    assert NotRun.read(tmp_path / "none.json") is None


def with_logs(experiment: ExperimentFiles) -> ExperimentFiles:
    """Each finished job's log written, as run-job leaves it."""
    for job in experiment.jobs:
        if job.result.exists():
            job.log.write_text(f"{job.job_id}: 1 of 1 valid settings\n{job.job_id}: 1 settings in 0.9 s: 1 failed\n")
    return experiment


COMPILE_ERROR = "compile failed: tiled.cu(12): error: identifier TILE undefined"  # make_result's


def test_a_settings_row_points_at_the_log_of_its_job(tmp_path, db_url, monkeypatch):
    """Issue 54: the row of a setting that failed says where its reason is whole, its job's log (run-job writes it
    there), by the path the rules name it; `convsweep query failures` stays on the line, which keeps to the
    table's width. The reason in the cell is still cut to REASON_CHARS."""
    monkeypatch.chdir(tmp_path)
    experiment = with_logs(experiment_files(Path("results"), [make_result("broken", 100, status="failed",
                                                                          experiment="e")], {}))
    lines = said(db_url, experiment).splitlines()
    assert lines[0] == "convsweep: e: 1 of 1 jobs finished; settings stored: 0 ok, 1 failed, 0 incorrect"
    assert " ".join(lines[3].split()) == f"1 setting failed {COMPILE_ERROR}"
    log = experiment.jobs[0].log
    assert str(log).startswith("results/e/logs/broken-b100-") and log.is_file()
    assert lines[4] == f"  more: {log}; {FAILURES}" and len(lines[4]) <= max(map(len, lines[1:4]))


def test_each_settings_reason_points_at_its_own_jobs_logs(tmp_path, db_url, monkeypatch):
    """Rows of several jobs: a `more on` line per reason names the first log of a job it describes and how many more;
    the hint, where it does not fit the table's width, is left out (every row names a log)."""
    monkeypatch.chdir(tmp_path)
    finished = [make_result("naive", 100, experiment="e"),
                make_result("broken", 100, status="failed", experiment="e"),
                make_result("broken", 1000, status="failed", experiment="e"),
                make_result("fp16", 100, status="incorrect", experiment="e")]
    experiment = with_logs(experiment_files(Path("results"), finished, {}))
    lines = said(db_url, experiment).splitlines()
    logs = {job.job_id.split("-s1-")[0]: job.log for job in experiment.jobs}
    assert [" ".join(line.split()[:4]) for line in lines[3:5]] == ["2 settings failed compile",
                                                                    "1 setting incorrect max_rel_err"]
    assert lines[5:] == [f"  more on failed, compile failed: tiled.cu(12): error: id…: {logs['broken-b100']} "
                         f"(and 1 more in results/e/logs)",
                         f"  more on incorrect, max_rel_err 0.5 exceeds tolerance 1e-05…: {logs['fp16-b100']}"]


def test_a_sweep_in_which_no_setting_finished_ok_exits_1_after_its_table(tmp_path, db_url):
    """Issue 54: a sweep whose every stored setting failed (or was incorrect) ended with status 0. Its table is printed
    and a line says why the status is 1; one ok setting anywhere in the sweep is today's status 0."""
    failed = experiment_files(tmp_path / "results", [make_result("broken", 100, status="failed", experiment="e"),
                                                     make_result("fp16", 100, status="incorrect", experiment="e")], {})
    out = io.StringIO()
    assert finish_sweep(db_url, [failed], out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "convsweep: e: 2 of 2 jobs finished; settings stored: 0 ok, 1 failed, 1 incorrect"
    assert lines[-1] == "convsweep: no setting finished ok, so `snakemake` exits 1"

    ok = experiment_files(tmp_path / "other", [make_result("naive", 100, experiment="other")], {})
    ok = dataclasses.replace(ok, name="other")
    out = io.StringIO()
    assert finish_sweep(db_url, [failed, ok], out=out) == 0
    assert "no setting finished ok" not in out.getvalue()

    mixed = experiment_files(tmp_path / "mixed", [make_result("naive", 100, experiment="mixed"),
                                                  make_result("broken", 100, status="failed", experiment="mixed")], {})
    assert finish_sweep(db_url, [dataclasses.replace(mixed, name="mixed")], out=io.StringIO()) == 0


def test_a_sweep_that_ran_no_job_or_cannot_be_read_is_not_said_to_have_nothing_ok(tmp_path, db_url):
    """Every job left out: the not-run line says why the status is 1, not a line about settings no job measured. A
    database that cannot be read cannot tell whether something was ok: its line alone, and the status is Snakemake's."""
    left_out = experiment_files(tmp_path / "results", [], {"naive-b100-x": None})
    left_out = dataclasses.replace(left_out, jobs=[dataclasses.replace(left_out.jobs[0], not_run=NO_GPU)])
    out = io.StringIO()
    assert finish_sweep(db_url, [left_out], out=out) == 1
    assert "no setting finished ok" not in out.getvalue() and "1 job was not run" in out.getvalue()

    (tmp_path / "bad.sqlite").write_text("not a database")
    unread = experiment_files(tmp_path / "unread", [make_result("broken", 100, status="failed", experiment="e")], {})
    out = io.StringIO()
    assert finish_sweep(f"sqlite:///{tmp_path / 'bad.sqlite'}", [unread], out=out) == 0
    assert "cannot tell what was stored" in out.getvalue() and "no setting finished ok" not in out.getvalue()


def test_a_jobs_log_says_each_reason_a_setting_is_not_ok_whole():
    """What run-job prints before its last line: a line per distinct reason, uncut, with its count, status and the
    tunables of its first setting; nothing where every setting is ok."""
    def setting(status, error=None, block=64):
        return types.SimpleNamespace(status=status, error=error, params={"conv1": {"BLOCK": block}})

    long_error = "kernels/broken.cu:3: " + "a compiler's sentence, " * 20 + "(variant 'broken', NVRTC)"
    measurements = [setting("ok"), setting("failed", long_error, 64), setting("failed", long_error, 128),
                    setting("incorrect", "max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)", 256),
                    setting("failed", None, 512)]
    assert settings_not_ok(measurements) == [
        f"2 settings failed (conv1 BLOCK=64 and 1 more): {long_error}",
        "1 setting incorrect (conv1 BLOCK=256): max_rel_err 0.5 exceeds tolerance 1e-05 (fp32)",
        "1 setting failed (conv1 BLOCK=512): no reason stored"]
    assert settings_not_ok([setting("ok")]) == []


class SnakemakesFormatter(logging.Formatter):
    def format(self, record):
        return f"snakemake's: {record.getMessage()}"


def record(msg: str, **extra) -> logging.LogRecord:
    made = logging.LogRecord("snakemake.logging", logging.ERROR, __file__, 1, msg, None, None)
    made.__dict__.update(extra)
    return made


def test_a_failed_job_is_two_lines_on_snakemakes_terminal(tmp_path):
    """BriefFailures, as Snakemake's console handler uses it: a job's error block becomes its id, why and log; the
    exception before it (the command, again) and the host banner are left out; anything else is Snakemake's."""
    log = tmp_path / "results" / "lenet86" / "logs" / "naive-b100-s1-pageable-0123456789.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"naive-b100: 1 of 1 valid settings\nconvsweep: {NO_GPU}\n")
    brief = BriefFailures(SnakemakesFormatter())
    error = record("Error in rule run_job, jobid: 4", event="job_error", log=[str(log)], shellcmd="convsweep ...")
    assert brief.filter(error) and brief.format(error) == (
        f"convsweep: failed: lenet86/naive-b100-s1-pageable-0123456789: {NO_GPU}\n  log: {log}")
    killed = record("Error in rule run_job, jobid: 5", event="job_error", log=[str(tmp_path / "gone.log")])
    assert brief.format(killed).startswith("convsweep: failed: ") and "stopped without a `convsweep:` line" in \
        brief.format(killed)
    command = record("RuleException:\nCalledProcessError in file infer.smk, line 24:\nCommand 'set -euo ...' "
                     "returned non-zero exit status 2.", event="error", exception="RuleException")
    assert not brief.filter(command) and not brief.filter(record("Workflow has started!", event="workflow_started"))
    other = record("WorkflowError:\nAt least one job did not complete successfully.", event="error",
                   exception="WorkflowError")
    assert brief.filter(other) and brief.format(other) == f"snakemake's: {other.getMessage()}"
    no_log = record("Error in rule all, jobid: 0", event="job_error", log=[])
    assert brief.format(no_log) == "snakemake's: Error in rule all, jobid: 0"
