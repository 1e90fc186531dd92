"""`convsweep report --draw` on a large store finishes in about the time and memory of a small one: each figure
groups or picks past a size (figures/drawing.py's MAX_*) and its caption says so. Issue 52: 10,000 runs took
204 s and 2.95 GB, 198 s of it the phases figure's one bar per job.

The large store is LARGE_JOBS jobs of LARGE_SETTINGS settings: 800 runs at 100 batches, naive and tiled at two
stream counts each, with energy, built through the real ingest in about eight seconds. It is past every limit of
the figures (jobs, batches, panels, tick labels): before the fix its report took 88 s against the small store's
2.7 s. build_store(url, directory, 2500, 4) is the store of 10,000 runs the issue's numbers were measured again on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from convsweep.figures import figure
from convsweep.figures.drawing import MAX_BARS, MAX_COLUMNS, MAX_ROWS
from convsweep.store import ingest_files, open_store
from store_fixtures import every_layer, make_job_file, make_result

pytest.importorskip("matplotlib", minversion="3.8", reason="figures need matplotlib (a dependency of convsweep)")

EXPERIMENT = "scale"
SMALL_JOBS, SMALL_SETTINGS = 8, 2  # 16 runs: every figure drawn one by one
LARGE_JOBS, LARGE_SETTINGS = 400, 2  # 800 runs, 100 batches
MAX_RSS_MB = 500
# The large report's time over the small one's: the figures cost the same, the tables and queries a little more.
TIME_RATIO = 2.5
TIME_SLACK_S = 3.0  # for a loaded machine's noise, on seconds-long runs


def job_files(jobs: int, settings: int) -> list[dict]:
    """`jobs` jobs of `settings` tunable settings each: naive and tiled at streams 1 and 4 at each batch (1, 2, ...),
    every setting with an energy per pass."""
    files = []
    for job in range(jobs):
        variant, streams, batch = ("naive", "tiled")[job % 2], (1, 4)[job // 2 % 2], 1 + job // 4
        slower = 1.0 if variant == "naive" else 0.6
        measurements = [make_result(variant, batch, streams=streams, experiment=EXPERIMENT,
                                    params=every_layer(BLOCK=64 * (k + 1)),
                                    op_time_ms=(0.01 * batch * slower * (1 + 0.1 * k), 0.02 * batch * slower),
                                    energy={"joules": 10.0 * (1 + 0.3 * ((k * 7) % 5)), "passes": 10,
                                            "joules_per_pass": 1.0 + 0.3 * ((k * 7) % 5)})
                        for k in range(settings)]
        files.append(make_job_file(measurements))
    return files


def build_store(url: str, directory: Path, jobs: int, settings: int) -> str:
    """A store of `jobs` x `settings` runs of experiment EXPERIMENT, ingested as `convsweep ingest` does."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for job in job_files(jobs, settings):
        path = directory / f"{job['job_id']}.json"
        path.write_text(json.dumps(job), encoding="utf-8")
        paths.append(path)
    engine = open_store(url)
    try:
        assert not ingest_files(engine, paths).errors
    finally:
        engine.dispose()
    return url


# Runs `convsweep report` and prints its wall time and the largest resident set of it and its workers (Linux:
# the children's ru_maxrss, kB, over every process it waited for: the figures' forked workers too).
MEASURE = """
import resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.run([sys.executable, "-m", "convsweep", *sys.argv[1:]], stdout=subprocess.DEVNULL).returncode
print(code, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def measured_report(url: str, out: Path) -> tuple[float, float]:
    """`convsweep report --draw` of the whole experiment into `out`: (seconds, peak MB)."""
    args = ["report", "--experiment", EXPERIMENT, "--db", url, "--figures", str(out / "figures"), "--draw",
            "--out", str(out / "summary.md"), "--markdown", str(out / "report.md"), "--html", str(out / "report.html"),
            "--tables", str(out / "tables")]
    proc = subprocess.run([sys.executable, "-c", MEASURE, *args], capture_output=True, text=True, cwd=out.parent)
    code, seconds, megabytes = proc.stdout.split()
    assert code == "0", proc.stderr
    return float(seconds), float(megabytes)


def caption(fig) -> str:
    return " ".join(t.get_text() for t in fig.texts).replace("\n", " ")


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("scale")
    return build_store(f"sqlite:///{directory / 'large.sqlite'}", directory / "files", LARGE_JOBS, LARGE_SETTINGS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory read as Linux's ru_maxrss")
def test_a_large_stores_report_takes_about_the_time_and_memory_of_a_small_ones(large, tmp_path):
    small = build_store(f"sqlite:///{tmp_path / 'small.sqlite'}", tmp_path / "small-files", SMALL_JOBS, SMALL_SETTINGS)
    small_s, small_mb = measured_report(small, tmp_path / "small-report")
    large_s, large_mb = measured_report(large, tmp_path / "large-report")
    drawn = sorted(p.name for p in (tmp_path / "large-report" / "figures").glob("*.png"))
    assert drawn == sorted(p.name for p in (tmp_path / "small-report" / "figures").glob("*.png")) == [
        "op-time.png", "pareto.png", "phases.png", "roofline.png", "speedup.png", "streams.png", "tuning.png"]
    assert large_s <= TIME_RATIO * small_s + TIME_SLACK_S, (large_s, small_s)
    assert large_mb <= min(MAX_RSS_MB, 2 * small_mb), (large_mb, small_mb)


@pytest.mark.parametrize("kind, said", [
    ("phases", f"{LARGE_JOBS} jobs, more than the {MAX_BARS} drawn one by one: each bar is a variant's mean job"),
    ("op-time", "100 batches, more than the 30 marked one by one: each line runs through all of them, unmarked"),
    ("speedup", "12 of 100 batches with a naive run shown, evenly spread from the first to the last."),
    ("roofline", "100 batches, more than the 8 a marker tells apart"),
    ("tuning", "4 of 100 batches with a grid shown"),
    ("streams", "4 of 100 batches at several stream counts shown"),
    ("pareto", "12 of 400 conv layers and batches with a front shown"),
])
def test_each_figure_of_a_large_store_says_what_it_grouped_or_picked(large, kind, said):
    fig = figure(kind, EXPERIMENT, large)
    assert said in caption(fig)
    labelled = [sum(bool(t.get_text()) for t in labels) for ax in fig.axes
                for labels in (ax.get_xticklabels(), ax.get_yticklabels())]
    assert max(labelled) <= MAX_BARS and len(fig.axes) <= MAX_COLUMNS * MAX_ROWS + 1


def test_phases_of_many_jobs_is_a_bar_per_variant_its_mean_job(large):
    fig = figure("phases", EXPERIMENT, large)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"naive: mean of {LARGE_JOBS // 2} jobs",
                                                            f"tiled: mean of {LARGE_JOBS // 2} jobs"]
    ends = {}
    for bar in ax.patches:
        ends[round(bar.get_y() + bar.get_height() / 2)] = max(ends.get(round(bar.get_y() + bar.get_height() / 2), 0),
                                                              bar.get_x() + bar.get_width())
    mean_job_s = 6.2 * LARGE_SETTINGS  # each job's settings' shares of its wall time (make_result's total_s) added up
    assert ends == {0: pytest.approx(mean_job_s), 1: pytest.approx(mean_job_s)}
