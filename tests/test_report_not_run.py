"""A report lists what its sweep asked for and has no result of (convsweep.report.coverage, issue 54): per variant
its batches and why (left out by a machine without a GPU, stopped, never started, not stored), the profiles and
confirmations not run, and where the failed settings are told; a run stored by an earlier attempt of a job whose
last left no result is not shown as if it were current. As a user meets it: a sweep on this machine (no GPU)."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from checkout_copy import copy_checkout
from convsweep import report
from convsweep.base.errors import ConvsweepError
from convsweep.analysis.outcome import GPU_JOBS_ENV, NotRun
from convsweep.base.document import Table
from convsweep.report.coverage import TITLE, Planned, left_out_key, read_coverage, section as coverage_section
from convsweep.store import ingest_result, open_store
from store_fixtures import make_result

NO_GPU_REASON = "no NVIDIA GPU or driver on this machine (libcuda.so: not found)"
SNAKEMAKE = shutil.which("snakemake")


def store(url: str, *results: dict) -> None:
    engine = open_store(url)
    try:
        for result in results:
            ingest_result(engine, result, None)
    finally:
        engine.dispose()


def spec(folder: Path, job_id: str, variant: str, batch: int, **axes) -> str:
    """The spec file the sweep writes for a job (plan.write_specs), with what the report reads of it."""
    (folder / "specs").mkdir(parents=True, exist_ok=True)
    (folder / "specs" / f"{job_id}.json").write_text(json.dumps(
        {"experiment": folder.name, "variants": {"conv1": variant, "conv2": variant}, "batch": batch, "streams": 1,
         "host_memory": "pageable", **axes, "job_id": job_id}))
    return job_id


def write_report(url: str, folder: Path) -> dict[str, str]:
    report.write(url, folder.name, markdown=folder / "report.md", page=folder / "report.html",
                 summary=folder / "summary.md", tables=folder / "tables", allow_empty=True)
    return {name: (folder / name).read_text() for name in ("report.md", "report.html", "summary.md")}


def section(markdown: str) -> str:
    return f"## {TITLE}" + markdown.split(f"## {TITLE}", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    """A Markdown section's table, one list of cells per row, the header and rule left out."""
    lines = [line for line in text.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_the_jobs_a_machine_left_out_are_listed_by_variant_with_their_batches_and_why(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    folder = tmp_path / "results" / "e"
    ran = make_result("reference", 100, experiment="e", profiler="cpu")
    store(url, ran)
    left = [spec(folder, f"{v}-b{b}", v, b) for v in ("naive", "fp16_fused_network") for b in (100, 1000, 10000)]
    NotRun(NO_GPU_REASON, (*(("run", job_id) for job_id in left), ("profile", left[0]), ("profile", left[1]),
                           ("winners", "winners-b100"))).write(folder / "not-run.json")
    texts = write_report(url, folder)

    said = section(texts["report.md"])
    assert said.count(NO_GPU_REASON) == 1  # once, not on every row
    assert "6 jobs of this experiment have no stored result: not run, no NVIDIA GPU" in said
    assert "`snakemake` on a machine with an NVIDIA GPU runs them" in said
    assert table_rows(said) == [["naive", "100, 1000 and 10000", "3"],
                                ["fp16_fused_network", "100, 1000 and 10000", "3"]]
    assert "Nor were its 2 Nsight Compute profiles and 1 confirmation of winners run, for the same reason." in said
    # before the variants: a reader sees what is missing before the one variant that ran
    assert texts["report.md"].index(f"## {TITLE}") < texts["report.md"].index("## `reference`")
    assert section(texts["summary.md"]) == said
    assert f"<h2>{TITLE}</h2>" in texts["report.html"] and "<td>fp16_fused_network</td>" in texts["report.html"]


def test_an_experiment_with_nothing_stored_says_what_was_asked_for(tmp_path):
    """lenet86-cache on a machine without a GPU: every job left out, the cells told apart by their L2 state."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    open_store(url).dispose()
    folder = tmp_path / "results" / "cache"
    left = [spec(folder, f"{v}-{c}", v, 100, cache=c) for v in ("naive", "tiled") for c in ("warm", "cold")]
    NotRun(NO_GPU_REASON, tuple(("run", job_id) for job_id in left)).write(folder / "not-run.json")
    texts = write_report(url, folder)
    for name in ("report.md", "summary.md"):
        assert "No run of this experiment is stored yet." in texts[name] and "retries them" not in texts[name]
        said = section(texts[name])
        assert "4 jobs of this experiment have no stored result: not run, " in said
        assert table_rows(said) == [["naive", "100", "warm and cold", "2"], ["tiled", "100", "warm and cold", "2"]]
    assert "| variant   |   batch | L2" in section(texts["report.md"])


def test_a_planned_job_without_a_result_says_why_and_its_earlier_runs_leave_the_tables(tmp_path):
    """The sweep's plan against what is stored: a job whose rerun stopped (its kernel fixed, and no GPU to run it
    on), one never started, one whose result is not stored. The stopped job's stored runs, a compile error of the
    kernel as it was, are from before: the report no longer shows that error as if it were current."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    folder = tmp_path / "results" / "e"
    ok = make_result("reference", 8, experiment="e", profiler="cpu")
    earlier = make_result("broken", 8, experiment="e", status="failed",
                          error="kernels/broken.cu:3: identifier \"undefined_name\" is undefined")
    failing = make_result("tiled", 8, experiment="e", status="failed")
    store(url, ok, earlier, failing)
    jobs = [spec(folder, r["job_id"], r["spec"]["variants"]["conv1"], 8) for r in (ok, earlier, failing)]
    jobs += [spec(folder, "naive-b8", "naive", 8), spec(folder, "naive-b16", "naive", 16),
             spec(folder, "fast-b8", "fast", 8)]
    Planned(tuple(jobs)).write(folder / "planned.json")
    (folder / "runs").mkdir()
    for job_id in (ok["job_id"], failing["job_id"], "fast-b8"):  # fast's result is written, not stored
        (folder / "runs" / f"{job_id}.json").write_text("{}")
    (folder / "logs").mkdir()
    (folder / "logs" / f"{earlier['job_id']}.log").write_text(f"compiling\nconvsweep: {NO_GPU_REASON}\n")
    (folder / "logs" / "naive-b16.log").write_text("killed before a word\n")
    texts = write_report(url, folder)

    said = section(texts["report.md"])
    assert "The sweep asks for 6 jobs of this experiment; 4 of them have no stored result:" in said
    assert table_rows(said) == [
        ["broken", "8", "1", "did not finish", NO_GPU_REASON],
        ["naive", "8", "1", "no result stored", "nothing says why"],
        ["naive", "16", "1", "did not finish", "stopped without a `convsweep:` line: see logs/naive-b16.log"],
        ["fast", "8", "1", "result not stored", "its result file is not in the database"]]
    assert "**no result stored**: `snakemake` again runs it." in said
    assert "**did not finish**: `snakemake` again runs them; each one's log, in logs/, says why it stopped." in said
    assert "The runs stored for `broken` are from an earlier attempt of its job" in said
    assert "Not listed here: 1 setting that ran and failed or gave wrong outputs, each under its variant below" in said
    for name in ("report.md", "summary.md", "report.html"):
        assert "undefined_name" not in texts[name] and "## `broken`" not in texts[name]
    assert "in Failed or incorrect above" in section(texts["summary.md"])
    seeds = list(csv.DictReader(io.StringIO((folder / "tables" / "seeds.csv").read_text())))
    assert sorted(row["variant"] for row in seeds) == ["reference", "tiled"]


def test_a_report_written_outside_its_experiments_folder_lists_nothing_more(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    store(url, make_result("reference", 8, experiment="e", profiler="cpu"))
    folder = tmp_path / "results" / "e"
    NotRun(NO_GPU_REASON, (("run", spec(folder, "naive-b8", "naive", 8)),)).write(folder / "not-run.json")
    report.write(url, "e", markdown=tmp_path / "report.md")  # not results/e/: whose records would it read?
    assert TITLE not in (tmp_path / "report.md").read_text()
    assert TITLE in write_report(url, folder)["report.md"]
    # every job stored: nothing to say
    store(url, make_result("naive", 8, experiment="e", job_id="naive-b8"))
    assert TITLE not in write_report(url, folder)["report.md"]


def test_a_long_list_of_values_stays_a_cell(tmp_path):
    folder = tmp_path / "results" / "e"
    left = [spec(folder, f"naive-b{b}", "naive", b) for b in range(1, 201)]
    NotRun(NO_GPU_REASON, tuple(("run", job_id) for job_id in left)).write(folder / "not-run.json")
    table = next(block for block in coverage_section(read_coverage(folder, ()), [], "") if isinstance(block, Table))
    assert table.rows == [["naive", "1, 2, 3, 4, 5, 6, … and 200 (200 values)", "200"]]


def test_the_plan_record_is_written_once_and_read_strictly(tmp_path):
    path = tmp_path / "planned.json"
    assert Planned.read(path) is None
    Planned(("a", "b")).write(path)
    assert Planned.read(path) == Planned(("a", "b"))
    os.utime(path, (1, 1))
    Planned(("a", "b")).write(path)
    assert path.stat().st_mtime == 1  # unchanged: its time says when the plan changed
    path.write_text('{"format": "planned-0", "jobs": []}')
    with pytest.raises(ConvsweepError, match="expected a planned-1 record"):
        Planned.read(path)


class FakePlan:
    """What left_out_key reads of a SweepPlan."""

    def __init__(self, left_out, gpu_variants):
        from types import SimpleNamespace

        self.left_out = left_out
        self.jobs = [SimpleNamespace(experiment="e", job_id=f"{v}-b8") for v in ("reference", *gpu_variants)]
        self.config = SimpleNamespace(experiments={"e": {"ncu": False}})

    def runs_here(self, experiment, job_id):
        return not self.left_out or job_id.startswith("reference")

    def winner_groups(self, experiment):
        return []


def test_the_report_rule_is_made_again_when_the_jobs_left_out_change():
    key = left_out_key(FakePlan(NO_GPU_REASON, ["naive"]), "e")
    assert key == left_out_key(FakePlan(NO_GPU_REASON, ["naive"]), "e")
    assert key != left_out_key(FakePlan(NO_GPU_REASON, ["naive", "tiled"]), "e")
    assert left_out_key(FakePlan(None, ["naive"]), "e") == "none"


# -- as a user meets it ------------------------------------------------------------------------------------------

def sweep(checkout: Path, work: Path, experiments: dict, env: dict) -> subprocess.CompletedProcess:
    defaults = {"network": "networks/lenet86.yaml", "batches": [8], "repeats": 1, "warmup": 0, "profiler": "events"}
    (work / "experiments.yaml").write_text(yaml.safe_dump(
        {"db_url": "sqlite:///db/results.sqlite",
         "experiments": {k: {**defaults, **v} for k, v in experiments.items()}}))
    return subprocess.run([SNAKEMAKE, "--snakefile", str(checkout / "Snakefile"), "--directory", str(work),
                           "--cores", "1"], capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_a_sweep_without_a_gpu_reports_the_jobs_it_left_out_and_reports_again_when_they_change(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key != GPU_JOBS_ENV} | {"CUDA_VISIBLE_DEVICES": ""}
    first = sweep(copy_checkout(tmp_path / "checkout"), work, {
        "mixed": {"variants": ["reference", "naive"], "batches": [8, 16]}, "gpu-only": {"variants": ["naive"]}}, env)
    assert first.returncode == 1, first.stderr[-3000:]  # jobs were left out
    mixed = work / "results" / "mixed"
    said = section((mixed / "report.md").read_text())
    # (with the sweep's plan record, the paragraph begins with how many jobs it asks for: 4)
    assert "2 jobs of this experiment have no stored result: not run, no NVIDIA GPU or driver" in said or \
        "The sweep asks for 4 jobs of this experiment; 2 of them have no stored result: not run, no NVIDIA GPU" in said
    assert table_rows(said) == [["naive", "8 and 16", "2"]]
    assert TITLE in (mixed / "summary.md").read_text() and TITLE in (mixed / "report.html").read_text()
    # an experiment none of whose jobs ran here: its report, written at the end of the sweep, says the same
    assert table_rows(section((work / "results" / "gpu-only" / "report.md").read_text())) == [["naive", "8", "1"]]

    # Another GPU variant asked for: no job runs here, nothing is stored anew, yet the report is made again.
    again = sweep(tmp_path / "checkout", work, {
        "mixed": {"variants": ["reference", "naive", "fused_conv_relu_pool"], "batches": [8, 16]},
        "gpu-only": {"variants": ["naive"]}}, env)
    assert again.returncode == 1 and "rule make_report:" in again.stderr, again.stderr[-3000:]
    assert "rule run_job:" not in again.stderr
    assert table_rows(section((mixed / "report.md").read_text())) == [["naive", "8 and 16", "2"],
                                                                      ["fused_conv_relu_pool", "8 and 16", "2"]]


def add_broken_variant(checkout: Path) -> Path:
    """A variant whose kernel does not compile: on this machine its job finishes, its setting stored as failed."""
    registry = yaml.safe_load((checkout / "kernels" / "variants.yaml").read_text())
    source = checkout / "kernels" / "broken.cu"
    source.write_text('#include "common.cuh"\nextern "C" __global__ void conv_forward(CONV_ARGS) {\n'
                      "  y[0] = undefined_name;\n}\n")
    registry["broken"] = {**registry["naive"], "source": "broken.cu", "params": {}, "description": "a syntax error"}
    (checkout / "kernels" / "variants.yaml").write_text(yaml.safe_dump(registry))
    return source


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_a_kernel_fixed_is_no_longer_reported_by_its_old_compile_error(tmp_path):
    """Fixed, the kernel compiles and its job stops where it needs the GPU this machine lacks: the report is made
    again, says so, and no longer shows the compile error of the kernel as it was."""
    checkout = copy_checkout(tmp_path / "checkout")
    source = add_broken_variant(checkout)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, GPU_JOBS_ENV: "run", "CUDA_VISIBLE_DEVICES": "", "CONVSWEEP_CACHE": str(tmp_path / "cache")}
    experiments = {"e": {"variants": ["reference", "broken"]}}
    first = sweep(checkout, work, experiments, env)
    assert first.returncode == 0, first.stderr[-3000:]
    markdown = work / "results" / "e" / "report.md"
    assert "undefined_name" in markdown.read_text()

    source.write_text((checkout / "kernels" / "naive.cu").read_text())
    fixed = sweep(checkout, work, experiments, env)
    assert fixed.returncode != 0, fixed.stderr[-3000:]  # it needs a GPU now
    text = markdown.read_text()
    assert "undefined_name" not in text, text
    said = section(text)
    assert "The sweep asks for 2 jobs of this experiment; 1 of them has no stored result: did not finish, no NVIDIA " \
           "GPU or driver" in said and table_rows(said) == [["broken", "8", "1"]]
