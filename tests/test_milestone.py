"""Each submission's milestone report (convsweep.analysis.milestone) on SQLite and PostgreSQL: the seeds' tables per
GPU and batch with the speedup over the baseline, Nsight Compute's verdict on each kernel, the nsys summary, and
every measurement stored of it, a resubmission included."""
import argparse

from datetime import datetime, timezone

import numpy as np
import pytest
from sqlalchemy.orm import Session

from convsweep.analysis.leaderboard import leaderboard
from convsweep.analysis.milestone import file_name, report, write_reports
from convsweep.app.commands import leaderboard as command
from convsweep.base.document import Paragraph, Table
from convsweep.store import ingest_result, open_store
from convsweep.store.models import KernelProfile
from leaderboard_fixtures import EXPERIMENT, H100, REASONS, course_run, drawn


@pytest.fixture
def course(db_url):
    """naive (the baseline), s01 measured twice (a resubmission: new sources, a day later, faster) and profiled by
    Nsight Compute, s04 incorrect; all on the H100 at batch 10000."""
    rng = np.random.default_rng(7)
    first = course_run("s01__tiled", drawn(rng, 30.0, 70.0))
    first["measurements"][0]["started_at"] = "2026-11-20T10:00:00+00:00"
    first["measurements"][0]["sources"] = {"submissions/s01/tiled.cu": "1" * 64}
    again = course_run("s01__tiled", drawn(rng, 20.0, 50.0))
    again["measurements"][0]["started_at"] = "2026-11-21T10:00:00+00:00"
    again["measurements"][0]["sources"] = {"submissions/s01/tiled.cu": "2" * 64}
    engine = open_store(db_url)
    for job_file in (course_run("naive", drawn(rng, 40.0, 100.0)), first, again,
                     course_run("s04__wrong", drawn(rng, 5.0, 10.0), status="incorrect")):
        ingest_result(engine, job_file, None)
    run_key = again["measurements"][0]["run_key"]
    at = datetime(2026, 11, 21, 11, tzinfo=timezone.utc)
    with Session(engine) as session, session.begin():
        session.add_all(KernelProfile(profile_id="p1", run_key=run_key, job_id="j", experiment=EXPERIMENT,
                                      variant="s01__tiled", batch=10000, setting=0, layer=layer, kernel="conv_forward",
                                      launch=0, duration_ms=1.5, sm_pct=40.0, memory_pct=85.5, dram_pct=80.0,
                                      achieved_occupancy_pct=60.0, occupancy_limiter="registers", bound=bound,
                                      metrics={}, gpu=H100, profiled_at=at, ingested_at=at)
                        for layer, bound in (("conv1", "memory"), ("conv2", "compute")))
    engine.dispose()
    return db_url


def texts(blocks) -> str:
    return "\n".join(b.text if isinstance(b, Paragraph) else
                     "\n".join(" | ".join(row) for row in [b.headers, *b.rows]) if isinstance(b, Table) else
                     getattr(b, "text", "") for b in blocks)


def test_a_ranked_submissions_page_has_its_results_speedup_profile_timeline_and_history(course):
    boards = leaderboard(course, EXPERIMENT)
    [board] = boards
    s01 = next(e for e in board.ranked if e.submission == "s01")
    base = next(e for e in board.ranked if e.submission == "naive")
    page = texts(report(course, boards, "s01"))
    results = next(b for b in report(course, boards, "s01") if isinstance(b, Table))
    (row,) = results.rows
    assert row[:5] == [H100, "10000", "b10000 s1 pageable", "s01__tiled", "rank 1, tier 1"]
    assert row[-1] == f"{base.op_time_sum_ms / s01.op_time_sum_ms:.2f}×"  # over naive, which ranked beside it
    assert "conv1 | conv_forward | 0 | 1.500 | memory | 40.0 | 85.5 | 80.0 | 60.0 | registers" in page
    assert "conv2 | conv_forward | 0 | 1.500 | compute" in page and "(profiled 2026-11-21 11:00)" in page
    assert "s01__tiled_forward" in page and "H2D" in page  # the nsys summary of its measured run
    history = [b for b in report(course, boards, "s01") if isinstance(b, Table)][-1]
    assert [r[0][:10] for r in history.rows] == ["2026-11-20", "2026-11-21"]  # oldest first, the resubmission last
    assert len({r[5] for r in history.rows}) == 2  # two sources


def test_a_submission_not_ranked_says_why_and_has_no_speedup(course):
    boards = leaderboard(course, EXPERIMENT)
    blocks = report(course, boards, "s04")
    (row,) = next(b for b in blocks if isinstance(b, Table)).rows
    assert row[4] == f"not ranked: incorrect ({REASONS['incorrect']})" and row[-1] == ""
    assert "Nsight Compute: no profile of this setting is stored" in texts(blocks)


def test_every_submission_gets_a_whole_page_from_the_command(course, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["leaderboard", "--db", course, "--experiment", EXPERIMENT, "--format", "csv",
                              "--reports", str(tmp_path / "reports")])
    args.func(args)
    assert capsys.readouterr().err == f"leaderboard: wrote 3 milestone reports into {tmp_path / 'reports'}\n"
    pages = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert pages == ["naive.html", "s01.html", "s04.html"]
    html = (tmp_path / "reports" / "s01.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.endswith("</html>\n")
    assert "<title>Milestone report: s01</title>" in html and html.count("<table>") == 5


def test_a_page_is_named_by_the_submission_and_nothing_else():
    assert file_name("jdoe2") == "jdoe2.html" and file_name("team-7") == "team-7.html"
    assert file_name("../etc/x") == ".._etc_x.html" and file_name("a+b") == "a+b.html"


def test_write_reports_makes_its_folder(course, tmp_path):
    written = write_reports(course, leaderboard(course, EXPERIMENT), tmp_path / "a" / "b", baseline=None)
    assert [p.parent for p in written] == [tmp_path / "a" / "b"] * 3
