"""A real Snakemake sweep on the CPU (the reference variant), into SQLite and PostgreSQL.

A machine without a GPU (every GPU hidden here) leaves the GPU jobs out of the sweep and says so first.
Asked to run them anyway (CONVSWEEP_GPU_JOBS=run), a job the machine cannot run (the naive jobs here)
fails and writes nothing: the sweep goes on, stores and tells what finished, and the next `snakemake`
runs it again.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from checkout_copy import copy_checkout
from convsweep.base.errors import ConvsweepError
from convsweep.analysis.outcome import REASON_CHARS
from convsweep.base.paths import ROOT
from convsweep.app.plan import GPU_JOBS_ENV, SweepPlan, release_scheduler_timer

SNAKEMAKE = shutil.which("snakemake")
pytestmark = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
# The GPU jobs run whatever the machine has: those of kernels that do not compile finish anywhere, the others
# fail where there is no GPU, as the tests of failures, edits and plans want.
EVERY_JOB = {**os.environ, GPU_JOBS_ENV: "run"}


def sweep_config(url: str, variants=("reference", "naive")) -> dict:
    return {
        "db_url": url,
        "results_dir": "results",
        "experiments": {
            "cpu-sweep": {
                "network": "networks/lenet86.yaml",
                "variants": list(variants),
                "batches": [16, 64],
                "repeats": 2,
                "warmup": 0,
                "profiler": "events",
            }
        },
    }


def snakemake(workdir: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    cmd = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def started(proc: subprocess.CompletedProcess, rule: str) -> int:
    """How many jobs of `rule` Snakemake started (its job blocks; an error block also names the rule)."""
    return len(re.findall(rf"^(?:local)?rule {rule}:$", proc.stderr, re.M))


def runs(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT run_key, variant, batch, status, error FROM run ORDER BY variant, batch, id")).all()
    finally:
        engine.dispose()


def check_sweep(tmp_path: Path, config_db_url: str, env: dict):
    # No GPU to be seen, on any machine, and the GPU jobs asked for: the naive jobs cannot run, which the sweep
    # must survive and tell, each in two lines (Snakemake's own block, and its command, in its log file alone).
    env = {**env, "CUDA_VISIBLE_DEVICES": "", GPU_JOBS_ENV: "run"}
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(sweep_config(config_db_url)))
    url = env.get("CONVSWEEP_DB", config_db_url)
    exp_dir = tmp_path / "results" / "cpu-sweep"
    first = snakemake(tmp_path, env=env)
    failed = re.findall(r"^convsweep: failed: cpu-sweep/(naive-b\d+)-\S+: no NVIDIA GPU or driver on this machine .*\n"
                        r"  log: (results/cpu-sweep/logs/naive-\S+\.log)$", first.stderr, re.M)
    assert first.returncode != 0, first.stderr[-3000:]
    assert sorted(job for job, _ in failed) == ["naive-b16", "naive-b64"], first.stderr[-3000:]
    assert "Error in rule" not in first.stderr and "convsweep run-job" not in first.stderr, first.stderr[-3000:]
    assert "Error in rule run_job" in next((tmp_path / ".snakemake" / "log").glob("*.log")).read_text()
    rows = runs(url)
    assert [(r.variant, r.status) for r in rows] == [("reference", "ok"), ("reference", "ok")]
    assert not list(exp_dir.glob("runs/naive-*.json"))
    # What finished is reported, so `snakemake --report` finds every file it lists
    assert "| reference" in (exp_dir / "summary.md").read_text() and (exp_dir / "report.html").is_file()
    assert "  report over the 2 jobs that finished: results/cpu-sweep/report.md" in first.stderr
    html = snakemake(tmp_path, "--report", "report.html", env=env)
    assert html.returncode == 0 and (tmp_path / "report.html").stat().st_size > 0, html.stderr[-3000:]
    reason = [line for line in next(exp_dir.glob("logs/naive-b16-*.log")).read_text().splitlines()
              if line.startswith("convsweep: ")][-1].removeprefix("convsweep: ")
    table = first.stderr[first.stderr.index("convsweep: cpu-sweep: "):].splitlines()
    assert table[0] == "convsweep: cpu-sweep: 2 of 4 jobs finished; settings stored: 2 ok, 0 failed, 0 incorrect"
    shown = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + "…"
    assert table[3].split(None, 4) == ["2", "jobs", "did", "not", f"finish  {shown}"]

    # The next `snakemake` runs the failed jobs again, and nothing else.
    retried = snakemake(tmp_path, env=env)
    assert retried.returncode != 0 and started(retried, "run_job") == 2, retried.stderr[-3000:]
    assert len(runs(url)) == 2

    # The GPU-less user's sweep: the reference variant alone. Its results were stored already.
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(sweep_config(config_db_url, ["reference"])))
    done = snakemake(tmp_path, env=env)
    assert done.returncode == 0 and started(done, "run_job") == 0, done.stderr[-3000:]
    assert "| reference" in (exp_dir / "summary.md").read_text()
    ingested = json.loads((exp_dir / "ingested.json").read_text())
    assert (ingested["added"], ingested["unchanged"]) == (0, 2)
    rows = runs(url)

    # As an interruption leaves it: one job's result never written, ingest and report never run.
    # The rerun measures only that job again: a new measurement, stored beside the first; the
    # other is not measured or stored again.
    for path in [*exp_dir.glob("runs/reference-b16-*.json"), exp_dir / "ingested.json", exp_dir / "summary.md"]:
        path.unlink()
    again = snakemake(tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert started(again, "run_job") == 1
    ingested = json.loads((exp_dir / "ingested.json").read_text())
    assert (ingested["added"], ingested["unchanged"]) == (1, 1)
    after = runs(url)
    assert len(after) == 3 and len({r.run_key for r in after}) == 2
    assert "convsweep: cpu-sweep: 2 of 2 jobs finished; settings stored: 2 ok, 0 failed, 0 incorrect; report: " \
           "results/cpu-sweep/report.md" in again.stderr

    # A result deleted, and nothing else: measured again, stored and reported.
    next(exp_dir.glob("runs/reference-b64-*.json")).unlink()
    remeasured = snakemake(tmp_path, env=env)
    assert remeasured.returncode == 0, remeasured.stderr[-3000:]
    assert [started(remeasured, rule) for rule in ("run_job", "ingest_results", "make_report")] == [1, 1, 1]
    assert len(runs(url)) == 4

    nothing = snakemake(tmp_path, env=env)
    assert "Nothing to be done" in nothing.stdout + nothing.stderr


def test_a_failed_ingest_is_tried_again(tmp_path):
    """A result that cannot be stored fails the ingest, which leaves no record behind: each `snakemake`
    tries it again (the report made before does not hide it) until the result is good again."""
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(sweep_config("sqlite:///db/results.sqlite",
                                                                           ["reference"])))
    exp_dir = tmp_path / "results" / "cpu-sweep"
    assert snakemake(tmp_path).returncode == 0
    bad = next(exp_dir.glob("runs/reference-b16-*.json"))
    bad.write_text('{"format": 3, "job_')
    for _ in range(2):
        failed = snakemake(tmp_path)
        assert failed.returncode != 0 and re.search(r"^convsweep: failed: cpu-sweep/ingest: .*\n  log: "
                                                    r"results/cpu-sweep/logs/ingest\.log$", failed.stderr, re.M), \
            failed.stderr[-3000:]
        assert not (exp_dir / "ingested.json").exists()
        assert re.search(r"\n  1 job +not stored +not valid JSON: ", failed.stderr), failed.stderr[-3000:]
    bad.unlink()  # measured again, stored, reported
    fixed = snakemake(tmp_path)
    assert fixed.returncode == 0 and started(fixed, "run_job") == 1, fixed.stderr[-3000:]
    assert (exp_dir / "ingested.json").is_file()
    assert len(runs(f"sqlite:///{tmp_path / 'db' / 'results.sqlite'}")) == 3


def test_cpu_sweep(tmp_path, db_url):
    """SQLite through db_url in the config; PostgreSQL through CONVSWEEP_DB, which wins over it."""
    if not db_url.startswith("sqlite"):
        env = {**os.environ, "CONVSWEEP_DB": db_url}
        check_sweep(tmp_path, "sqlite:///unused.sqlite", env=env)
        assert not (tmp_path / "unused.sqlite").exists()
        return  # `convsweep query` refuses the test server's superuser role (convsweep.analysis.query says why)
    check_sweep(tmp_path, db_url, dict(os.environ))
    query = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "query", "summary", "--db", db_url],
                           capture_output=True, text=True)
    assert query.returncode == 0 and "reference" in query.stdout, query.stderr


def test_lint_is_clean(tmp_path):
    shutil.copy(ROOT / "experiments.yaml", tmp_path)  # the default sweep, linted where it writes nothing of ROOT's
    out = subprocess.run([SNAKEMAKE, "--lint", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Lints for" not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("experiment, expected", [
    ({"variants": ["naive"], "batches": [100], "streamz": [1]}, "experiments.e.streamz: unknown key; did you mean "
                                                                "'streams'?"),
    ({"variants": ["nieve"], "batches": [100]}, "experiments.e.variants[0]: unknown variant 'nieve'"),
    ({"network": "networks/conv256.yaml", "dataset": "random", "variants": ["tf32_sliding_window"], "batches": [1]},
     "experiments.e.variants[0]: layer conv1 of conv256.yaml: variant 'tf32_sliding_window' cannot handle B=1 C=256"),
])
def test_bad_config_stops_the_workflow_with_one_line(tmp_path, experiment, expected):
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump({"experiments": {"e": experiment}}))
    proc = snakemake(tmp_path, "--dry-run")
    assert proc.returncode != 0
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("Using workflow")]
    assert len(said) == 1 and re.match(rf"convsweep: experiments\.yaml:\d+: {re.escape(expected)}", said[0]), said
    assert not (tmp_path / "results").exists()


def mapping_bomb(levels: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases repeat a mapping 10^levels times."""
    lines = ['a0: &a0 {x: 1, y: 2}']
    lines += [f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + "}" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nexperiments: {e: {variants: [reference], batches: [8]}}\n"


def test_a_mapping_alias_bomb_in_experiments_yaml_is_one_line_before_snakemake_reads_it(tmp_path):
    """Snakemake's own config loader walks every repetition of an alias: convsweep's bounded loader reads the
    default config file first, so the bomb is one line in seconds instead of minutes and gigabytes."""
    (tmp_path / "experiments.yaml").write_text(mapping_bomb())
    started = time.monotonic()
    proc = snakemake(tmp_path, "--dry-run")
    assert proc.returncode != 0 and time.monotonic() - started < 60
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("Using workflow")]
    assert len(said) == 1 and said[0].startswith("convsweep: experiments.yaml:") and "aliases" in said[0], said


def test_a_configfile_replaces_the_default_sweep(tmp_path):
    shutil.copy(ROOT / "experiments.yaml", tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"experiments": {"only-this": {"variants": ["reference"], "batches": [8]}}}))
    proc = subprocess.run([SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--dry-run", "--configfile", str(other),
                           "--cores", "1"], capture_output=True, text=True, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "only-this" in out and "lenet86-baseline" not in out


# --- the profile, failures, edits and interruptions, as a user meets them ----------------------


def run_in(checkout: Path, workdir: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    """`snakemake` with the Snakefile of `checkout` (a copy, when a test edits kernels)."""
    cmd = [SNAKEMAKE, "--snakefile", str(checkout / "Snakefile"), "--directory", str(workdir), "--cores", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def small_sweep(workdir: Path, experiments: dict) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    defaults = {"network": "networks/lenet86.yaml", "batches": [8], "repeats": 1, "warmup": 0, "profiler": "events"}
    (workdir / "experiments.yaml").write_text(yaml.safe_dump(
        {"db_url": "sqlite:///db/results.sqlite", "experiments": {k: {**defaults, **v} for k, v in experiments.items()}}))


def planned(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's "Job stats" table of a dry run: rule -> count."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {parts[0]: int(parts[1]) for parts in (line.split() for line in table.splitlines()[3:])
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total"}


def history(workdir: Path) -> list[tuple]:
    engine = create_engine(f"sqlite:///{workdir / 'db' / 'results.sqlite'}")
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT job_id, variant, source_hash, status, error FROM run ORDER BY job_id, id")).all()
    finally:
        engine.dispose()


def test_plain_snakemake_uses_the_default_profile(tmp_path):
    """From the root of a fresh clone, as a user types it (no --cores: the profile gives them): the
    workflow profile is read, so up to four GPU jobs run at once (each measuring under its GPU's
    lock) and a job timed on the CPU alone; failures do not stop the sweep, an interrupted one
    resumes. A copy of the checkout, so a sweep already run in this one changes nothing here."""
    clone = copy_checkout(tmp_path / "clone")
    proc = subprocess.run([SNAKEMAKE, "-n"], capture_output=True, text=True, cwd=clone, timeout=300, env=EVERY_JOB)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Using workflow specific profile profiles/default" in out
    blocks = [block.split("\n\n", 1)[0] for block in out.split("rule run_job:")[1:]]
    assert len(blocks) == 41, out[-3000:]  # every job of the default sweep: nothing of it was run here
    run_job = next(block for block in blocks if "job=reference-" not in block)  # a GPU job (the CPU ones ask gpu=0)
    assert "gpu=1" in run_job and "gpu_jobs=1" in run_job and "threads:" not in run_job
    assert "threads: 4" in next(block for block in blocks if "job=reference-" in block)
    assert "input: networks/lenet86.yaml, " in run_job  # the checkout's files, named as from where the user is
    profile = yaml.safe_load((clone / "profiles" / "default" / "config.yaml").read_text())
    assert profile["keep-going"] is True and profile["rerun-incomplete"] is True
    assert profile["cores"] == 4 and profile["resources"] == ["gpu_jobs=4"]
    assert not (clone / "workflow" / "profiles").exists()  # where Snakemake never looks


def add_broken_variants(checkout: Path, *names: str) -> None:
    """Register variants whose kernels do not compile: on any machine their jobs finish (the job compiles
    before it needs a GPU), each setting stored as failed with the compiler's line."""
    registry = yaml.safe_load((checkout / "kernels" / "variants.yaml").read_text())
    for name in names:
        (checkout / "kernels" / f"{name}.cu").write_text('#include "common.cuh"\n'
                                                         'extern "C" __global__ void conv_forward(CONV_ARGS) {\n'
                                                         '  y[0] = undefined_name;\n}\n')
        registry[name] = {**registry["naive"], "source": f"{name}.cu", "params": {},
                          "description": f"{name}: one thread per output, and a syntax error"}
    (checkout / "kernels" / "variants.yaml").write_text(yaml.safe_dump(registry))


def test_a_failed_compile_does_not_stop_the_other_jobs(tmp_path):
    """A kernel with a syntax error is a result: its job stores the setting as failed with the
    compiler's line and the others are measured. A job that dies (killed, as the OOM killer would)
    fails only itself; the rest of the sweep goes on (keep-going), and the next `snakemake` finishes it."""
    checkout = copy_checkout(tmp_path / "checkout")
    add_broken_variants(checkout, "broken")
    work = tmp_path / "work"
    small_sweep(work, {"with-broken": {"variants": ["reference", "broken"]},
                       "victim": {"variants": ["reference"], "batches": [16, 32]},
                       "bystander": {"variants": ["reference"], "batches": [24]}})
    env = {**EVERY_JOB, "CONVSWEEP_CACHE": str(tmp_path / "cache")}  # compiles take real time
    cmd = [SNAKEMAKE, "--snakefile", str(checkout / "Snakefile"), "--directory", str(work), "--cores", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    killed = kill_when_running("specs/reference-b32-", proc, work)
    out = proc.communicate(timeout=900)[0]
    logs = {log.name: log.read_text()[-500:] for log in (work / "results" / "victim" / "logs").glob("reference-b32-*")}
    assert killed, f"{[line for line in out.splitlines() if 'b32' in line]}\n{logs}\n{out[-2000:]}"
    assert proc.returncode != 0 and re.search(r"^convsweep: failed: victim/reference-b32-\S+: stopped without a "
                                              r"`convsweep:` line: see its log\n  log: ", out, re.M), out[-3000:]
    summary = (work / "results" / "with-broken" / "summary.md").read_text()
    assert "## Failed or incorrect" in summary and "undefined_name" in summary  # the report shows why
    assert (work / "results" / "bystander" / "summary.md").is_file()
    # the victim's report is written over the job that finished, and written again once the other has run
    assert "| reference" in (work / "results" / "victim" / "summary.md").read_text()
    reported_early = (work / "results" / "victim" / "summary.md").stat().st_mtime
    assert len(list((work / "results" / "victim" / "runs").glob("reference-*.json"))) == 1  # ran regardless
    assert "convsweep: victim: 1 of 2 jobs finished; settings stored: 1 ok, 0 failed, 0 incorrect" in out
    assert "convsweep: with-broken: 2 of 2 jobs finished; settings stored: 1 ok, 1 failed, 0 incorrect" in out
    rows = {r.variant: r for r in history(work)}
    assert rows["broken"].status == "failed"
    assert rows["broken"].error.startswith("kernels/broken.cu:3: identifier \"undefined_name\" is undefined")
    assert rows["reference"].status == "ok"

    finish = run_in(checkout, work, env=env)
    assert finish.returncode == 0, (finish.stdout + finish.stderr)[-3000:]
    assert (work / "results" / "victim" / "summary.md").stat().st_mtime > reported_early


def test_a_sweep_whose_every_setting_failed_exits_1_and_its_table_points_at_the_log_with_the_whole_reason(tmp_path):
    """Issue 54, as it was reproduced: naive.cu with `int x = undefined_name;` at line 3 is two compiler errors. The
    sweep of it alone exited 0, its job's log held only `1 settings in 0.9 s: 1 failed`, and the table's `more:`
    named `convsweep query failures`. Now the log holds NVRTC's whole message (file:line first) and the setting's
    reason uncut, its last line is still the job's summary, the table points at that log, and the status is 1.
    A sweep with one ok setting beside it keeps status 0."""
    checkout = copy_checkout(tmp_path / "checkout")
    registry = yaml.safe_load((checkout / "kernels" / "variants.yaml").read_text())
    registry["broken"] = {**registry["naive"], "source": "broken.cu", "compile_time": ["C"]}  # a build per layer
    (checkout / "kernels" / "variants.yaml").write_text(yaml.safe_dump(registry))
    naive = (checkout / "kernels" / "naive.cu").read_text().splitlines(keepends=True)
    (checkout / "kernels" / "broken.cu").write_text("".join(naive[:2] + ["int x = undefined_name;\n"] + naive[2:]))
    work = tmp_path / "work"
    experiment = {"variants": ["broken"]}
    small_sweep(work, {"b": experiment})
    env = {**EVERY_JOB, "CONVSWEEP_CACHE": str(tmp_path / "cache")}
    proc = run_in(checkout, work, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    log = next((work / "results" / "b" / "logs").glob("broken-b8-*.log"))
    said = log.read_text().splitlines()
    assert said.count("NVRTC's whole message for broken (BLOCK=256,C_FIXED=1; 1 more build said the same):") == 1
    assert "  kernels/broken.cu:3: error: identifier \"undefined_name\" is undefined" in said, said
    assert any(line.startswith("  kernels/broken.cu:3: error: A namespace scope variable") for line in said), said
    assert "  2 errors detected in the compilation of \"kernels/broken.cu\"." in said
    stored = history(work)[0].error
    assert stored.startswith("kernels/broken.cu:3: A namespace scope variable") and len(stored) > 2 * REASON_CHARS
    assert f"1 setting failed (conv1 BLOCK=256; conv2 BLOCK=256): {stored}" in said
    assert said[-1].startswith(f"{log.stem}: 1 settings in ") and said[-1].endswith(" s: 1 failed")

    table = proc.stderr[proc.stderr.index("convsweep: b: "):].splitlines()
    assert table[0] == "convsweep: b: 1 of 1 jobs finished; settings stored: 0 ok, 1 failed, 0 incorrect"
    assert table[3].split(None, 2)[2] == "failed  " + stored[:REASON_CHARS - 1] + "…"
    assert table[4] == f"  more: results/b/logs/{log.name}; `convsweep query failures`"
    assert table[5:] == ["convsweep: no setting finished ok, so `snakemake` exits 1"], table

    small_sweep(work, {"b": experiment, "ok": {"variants": ["reference"]}})
    mixed = run_in(checkout, work, env=env)
    assert mixed.returncode == 0 and started(mixed, "run_job") == 1, mixed.stderr[-3000:]
    assert "no setting finished ok" not in mixed.stderr
    assert f"  more: results/b/logs/{log.name}; `convsweep query failures`" in mixed.stderr.splitlines()


def kill_when_running(pattern: str, snakemake: subprocess.Popen, workdir: Path) -> bool:
    """SIGKILL the first convsweep process of this sweep (working in `workdir`, so never another test's when
    tests run in parallel) whose command line holds `pattern`, while `snakemake` runs (the job's Python, not
    the shell around it, whose line defines the `convsweep` function)."""
    workdir = workdir.resolve()
    while snakemake.poll() is None:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ours = pattern in args and Path(os.readlink(cmdline.parent / "cwd")) == workdir
            except OSError:
                continue
            if ours and "-m convsweep" in args and "convsweep()" not in args:
                try:
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)
                    return True
                except ProcessLookupError:
                    continue
        time.sleep(0.01)
    return False


def test_editing_a_kernel_re_measures_exactly_the_jobs_that_use_it(tmp_path):
    """Two GPU variants whose kernels do not compile, so that their jobs finish on any machine."""
    checkout = copy_checkout(tmp_path / "checkout")
    add_broken_variants(checkout, "broken_a", "broken_b")
    work = tmp_path / "work"
    small_sweep(work, {"e": {"variants": ["reference", "broken_a", "broken_b"]}})

    def dry_run() -> dict[str, int]:
        return planned(run_in(checkout, work, "-n", env=EVERY_JOB))

    first = run_in(checkout, work, env=EVERY_JOB)
    assert first.returncode == 0, first.stderr[-3000:]
    assert dry_run() == {}

    kernel = checkout / "kernels" / "broken_a.cu"
    kernel.write_text(kernel.read_text() + "// edited: one more line\n")
    # ... and the confirmation of its cell (the one cell of both broken variants: reference runs on the CPU)
    assert dry_run() == {"run_job": 1, "confirm_winners": 1, "ingest_results": 1, "make_report": 1, "all": 1}
    second = run_in(checkout, work, env=EVERY_JOB)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = history(work)
    measured = {}
    for row in rows:
        measured.setdefault(row.variant, []).append(row.source_hash)
    assert len(measured["broken_a"]) == 2 and measured["broken_a"][0] != measured["broken_a"][1]
    assert len(measured["broken_b"]) == 1 and measured["reference"] == [None]

    # A registry entry is a parameter of its variant's jobs; its description is not
    registry = checkout / "kernels" / "variants.yaml"
    text_before = registry.read_text()
    edited = text_before.replace("broken_b: one thread per output, and a syntax error",
                                 "broken_b: one thread per output element, and a syntax error")
    assert edited != text_before
    registry.write_text(edited)
    assert dry_run() == {}
    entries = yaml.safe_load(edited)
    entries["broken_b"]["constraints"] = [*entries["broken_b"].get("constraints", []), "B >= 1"]
    registry.write_text(yaml.safe_dump(entries))
    assert dry_run() == {"run_job": 1, "confirm_winners": 1, "ingest_results": 1, "make_report": 1, "all": 1}
    registry.write_text(edited)

    # A shared header is an input of every job whose kernels include it (layers.cu: every GPU job)
    header = checkout / "kernels" / "common.cuh"
    header.write_text(header.read_text() + "// edited\n")
    assert dry_run() == {"run_job": 2, "confirm_winners": 1, "ingest_results": 1, "make_report": 1, "all": 1}


def test_a_sweep_killed_halfway_resumes_with_every_job_stored_once(tmp_path):
    work = tmp_path / "work"
    small_sweep(work, {"e": {"variants": ["reference"], "batches": [8, 16, 24, 32, 40, 48]}})
    cmd = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work), "--cores", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    runs_dir = work / "results" / "e" / "runs"
    deadline = time.monotonic() + 600
    while len(list(runs_dir.glob("*.json"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake and the job it was running, as a node crash would
    proc.wait()
    assert 2 <= len(list(runs_dir.glob("*.json"))) < 6

    locked = run_in(ROOT, work)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
    assert run_in(ROOT, work, "--unlock").returncode == 0
    resumed = run_in(ROOT, work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = history(work)
    assert len(rows) == 6 and len({r.job_id for r in rows}) == 6
    assert not [p for p in work.rglob("*") if p.name.endswith(".tmp")]
    for path in (work / "results").rglob("*.json"):
        json.loads(path.read_text())  # every file whole


def test_planning_a_sweep_does_not_import_the_gpu_runtime():
    """The Snakefile's parse plans every job (settings, sources) from the network's structure alone."""
    code = ("import sys\n"
            "from convsweep.app.plan import SweepPlan\n"
            "from convsweep.base.paths import ROOT\n"
            "from convsweep.base.yamlio import load_yaml\n"
            "plan = SweepPlan(load_yaml((ROOT / 'experiments.yaml').read_text()), ROOT / 'experiments.yaml')\n"
            "for job in plan.jobs:\n"
            "    job.runs(), plan.registry_entries(job.experiment, job.job_id), plan.job_sources(job.experiment, job.job_id)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('cuda', 'convsweep.device.gpu', 'convsweep.measure.runner'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_only_jobs_on_gpu_variants_ask_for_a_gpu():
    """run_job's `gpu` resource: a cluster holds a GPU for a GPU cell, none for a cell on the CPU
    reference variant (a per-layer map counts as GPU when any of its layers is)."""
    config = {"experiments": {"e": {"variants": ["reference", "naive", {"conv1": "naive", "conv2": "restrict_unroll"}],
                                    "batches": [8, 16]}}}
    plan = SweepPlan(config, ROOT / "experiments.yaml")
    gpus = {(tuple(sorted(set(j.variants.values()))), j.batch): plan.gpus(j.experiment, j.job_id) for j in plan.jobs}
    assert gpus == {(("reference",), 8): 0, (("reference",), 16): 0, (("naive",), 8): 1, (("naive",), 16): 1,
                    (("naive", "restrict_unroll"), 8): 1, (("naive", "restrict_unroll"), 16): 1}


@pytest.mark.parametrize("ncu, files, mode", [(False, 0, None), (True, 1, "true"), ("auto", 1, "auto")])
def test_a_profile_job_is_told_whether_ncu_is_required(ncu, files, mode):
    """`ncu: true` fails a profile job on a machine without ncu; `auto` (the default sweep's) lets it write a
    skipped profile instead, so a GPU machine with only the driver runs the default sweep to its end."""
    config = {"experiments": {"e": {"variants": ["reference", "naive"], "batches": [8], "ncu": ncu}}}
    plan = SweepPlan(config, ROOT / "experiments.yaml")
    assert len(plan.profile_files("e")) == files
    if mode:
        assert plan.ncu("e") == mode


def test_ncu_takes_true_false_or_auto():
    with pytest.raises(ConvsweepError, match=r"experiments\.e\.ncu"):
        SweepPlan({"experiments": {"e": {"variants": ["naive"], "batches": [8], "ncu": "maybe"}}},
                  ROOT / "experiments.yaml")


def test_the_rule_takes_its_gpu_resource_from_the_plan(tmp_path):
    """What Snakemake hands the executor: gpu=0 for the reference job, gpu=1 for the naive one;
    gpu_jobs alike, so the profile's limit counts GPU jobs only (the reference job never waits)."""
    small_sweep(tmp_path, {"e": {"variants": ["reference", "naive"]}})
    out = run_in(ROOT, tmp_path, "-n", env=EVERY_JOB).stdout
    blocks = [block.split("\n\n", 1)[0] for block in out.split("rule run_job:")[1:]]
    asked = dict(re.search(r"job=([a-z_]+)-b.*\bgpu=(\d+)", block, re.S).groups() for block in blocks)
    assert asked == {"reference": "0", "naive": "1"}, out[-3000:]
    slots = dict(re.search(r"job=([a-z_]+)-b.*\bgpu_jobs=(\d+)", block, re.S).groups() for block in blocks)
    assert slots == asked, out[-3000:]


def test_a_job_timed_on_the_cpu_runs_alone(tmp_path):
    """The reference job asks for every core (Snakemake caps threads at --cores), so no other job shares the
    host while it times; a GPU job asks for one. On a cluster (no --cores) each job asks for one."""
    small_sweep(tmp_path, {"e": {"variants": ["reference", "naive"]}})
    out = run_in(ROOT, tmp_path, "-n", "--cores", "3", env=EVERY_JOB).stdout
    blocks = [block.split("\n\n", 1)[0] for block in out.split("rule run_job:")[1:]]
    threads = {re.search(r"job=([a-z_]+)-b", block).group(1): re.search(r"threads: (\d+)", block) for block in blocks}
    assert threads["reference"] and threads["reference"].group(1) == "3", out[-3000:]
    assert threads["naive"] is None, out[-3000:]  # one thread: Snakemake leaves the line out
    plan = SweepPlan({"experiments": {"e": {"variants": ["reference"], "batches": [8]}}}, ROOT / "experiments.yaml")
    assert plan.threads("e", plan.jobs[0].job_id, None) == 1


def test_the_report_draws_the_ceilings_of_the_bench_file_the_sweep_names(tmp_path):
    """`bench: FILE` reaches the report command (and is its input); a wrong file stops the plan."""
    small_sweep(tmp_path, {"e": {"variants": ["reference"]}})
    out = run_in(ROOT, tmp_path, "-n", "-p", "--config", "bench=docs/bench-h100.json").stdout
    report_command = next(line for line in out.splitlines() if "convsweep report " in line)
    assert f"--bench {ROOT / 'docs' / 'bench-h100.json'}" in report_command
    assert "--bench" not in next(line for line in run_in(ROOT, tmp_path, "-n", "-p").stdout.splitlines()
                                 if "convsweep report " in line)

    (tmp_path / "not-a-bench.json").write_text(json.dumps({"device": "x"}))
    config = {"experiments": {"e": {"variants": ["reference"], "batches": [8]}}}
    with pytest.raises(ConvsweepError) as bad:
        SweepPlan({**config, "bench": str(tmp_path / "not-a-bench.json")}, "sweep.yaml")
    assert str(bad.value) == ("sweep.yaml: bench: no ceilings.dtod_GBps (the device copy rate): expected the file "
                              "`convsweep bench --json FILE` writes")
    with pytest.raises(ConvsweepError, match=r"^sweep.yaml: bench: cannot read it \(No such file or directory\)$"):
        SweepPlan({**config, "bench": "docs/no-such-bench.json"}, "sweep.yaml")


class _Scheduler:
    """Stands in for Snakemake's JobScheduler: the timer's callback has its qualified name."""

    def _schedule_reevalutation(self, delay):
        timer = threading.Timer(delay, lambda: None)
        timer.start()
        return timer


def test_a_finished_run_does_not_wait_for_snakemakes_rescheduling_timer():
    from snakemake.scheduling.job_scheduler import JobScheduler

    # The workaround names Snakemake's method: if Snakemake renames it, this says the workaround is dead.
    assert hasattr(JobScheduler, "_schedule_reevalutation")
    leftover = _Scheduler()._schedule_reevalutation(60)
    unrelated = threading.Timer(60, lambda: None)
    unrelated.start()
    try:
        release_scheduler_timer()
        leftover.join(timeout=5)
        assert not leftover.is_alive()
        assert unrelated.is_alive()
    finally:
        unrelated.cancel()


def test_a_targeted_sweep_leaves_the_other_experiments_files_alone(tmp_path):
    """`snakemake results/first/summary.md` ends with the first experiment's outcome only: it writes no report
    of the second, which would then stand as done (seen on the lent H100 with sweeps/search.yaml: the second
    experiment's own targeted run said "Nothing to be done"). Then the second runs when asked for."""
    small_sweep(tmp_path, {"first": {"variants": ["reference"]}, "second": {"variants": ["reference"]}})
    proc = snakemake(tmp_path, "results/first/summary.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "convsweep: first: 1 of 1 jobs finished" in proc.stderr and "convsweep: second" not in proc.stderr
    second = tmp_path / "results" / "second"
    # Its plan alone (the job's spec, and the jobs its report will compare with what is stored): no report, no run.
    assert sorted({p.relative_to(second).parts[0] for p in second.rglob("*") if p.is_file()}) == ["planned.json", "specs"]
    proc = snakemake(tmp_path, "results/second/summary.md")
    assert proc.returncode == 0 and started(proc, "run_job") == 1, proc.stderr[-3000:]
    assert "convsweep: second: 1 of 1 jobs finished" in proc.stderr


def test_the_experiments_a_target_names():
    plan = SweepPlan({"results_dir": "results", "experiments": {
        "a": {"variants": ["reference"], "batches": [8]}, "b": {"variants": ["reference"], "batches": [8]}}}, "x.yaml")
    assert plan.targeted_experiments([]) == plan.targeted_experiments(["all"]) == ["a", "b"]
    assert plan.targeted_experiments(["results/b/summary.md", "./results/b/report.md"]) == ["b"]
    assert plan.targeted_experiments(["results/a/runs/x.json", "results/b/ingested.json"]) == ["a", "b"]
    assert plan.targeted_experiments(["elsewhere/file.txt"]) == ["a", "b"]


# --- the store a sweep's ingest records are made for (issue 52) ----------------------------------


def measurement_ids(workdir: Path) -> list[str]:
    engine = create_engine(f"sqlite:///{workdir / 'db' / 'results.sqlite'}")
    try:
        with engine.connect() as c:
            return sorted(c.execute(text("SELECT measurement_id FROM run")).scalars())
    finally:
        engine.dispose()


def delete_store(workdir: Path) -> None:
    for path in (workdir / "db").glob("results.sqlite*"):
        path.unlink()


def test_a_deleted_database_is_filled_again_from_the_result_files(tmp_path):
    """The ingest records said "Nothing to be done" for a database deleted after a finished sweep: its
    results were never stored again. Now they are, from the result files, none measured again; a dry run
    says so and creates nothing; another database at the same path is filled as well."""
    small_sweep(tmp_path, {"e": {"variants": ["reference"], "batches": [8, 16]}})
    first = snakemake(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    stored = measurement_ids(tmp_path)
    assert len(stored) == 2

    delete_store(tmp_path)
    dry = snakemake(tmp_path, "--dry-run")
    assert planned(dry) == {"ingest_results": 1, "make_report": 1, "all": 1}
    assert "Params have changed since last execution" in dry.stdout + dry.stderr
    assert not (tmp_path / "db" / "results.sqlite").exists()
    again = snakemake(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [started(again, rule) for rule in ("run_job", "ingest_results", "make_report")] == [0, 1, 1]
    assert measurement_ids(tmp_path) == stored
    assert planned(snakemake(tmp_path, "--dry-run")) == {}

    # A database made at that path by hand (`convsweep ingest` of nothing), empty: filled too, then left alone.
    delete_store(tmp_path)
    made = subprocess.run([sys.executable, "-m", "convsweep", "ingest", "--db", "sqlite:///db/results.sqlite"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0 and measurement_ids(tmp_path) == [], made.stderr
    refilled = snakemake(tmp_path)
    assert refilled.returncode == 0 and started(refilled, "run_job") == 0, refilled.stderr[-3000:]
    assert measurement_ids(tmp_path) == stored
    assert planned(snakemake(tmp_path, "--dry-run")) == {}


def test_a_deleted_database_is_filled_again_when_another_job_fails(tmp_path):
    """A job that fails keeps the ingest rule from running: the end of the sweep stores what finished, which
    the record made for the deleted database would have claimed stored already."""
    env = {**EVERY_JOB, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, and asked for: the naive job fails, on any machine
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(sweep_config("sqlite:///db/results.sqlite",
                                                                           ["reference"])))
    assert snakemake(tmp_path, env=env).returncode == 0
    stored = measurement_ids(tmp_path)
    delete_store(tmp_path)
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(sweep_config("sqlite:///db/results.sqlite")))
    failed = snakemake(tmp_path, env=env)
    assert failed.returncode != 0 and started(failed, "run_job") == 2, failed.stderr[-3000:]
    assert measurement_ids(tmp_path) == stored
    assert "convsweep: cpu-sweep: 2 of 4 jobs finished; settings stored: 2 ok, 0 failed, 0 incorrect" in failed.stderr


def test_nan_in_the_sweep_file_stops_the_sweep_with_one_line_before_any_job(tmp_path):
    """YAML's .nan passed the schema's bounds and stopped the sweep in onstart with a traceback (issue 52)."""
    config = sweep_config("sqlite:///db/results.sqlite", ["reference"])
    config["experiments"]["cpu-sweep"].update(repeats="auto", stopping={"max_noise": float("nan")})
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(config))
    assert ".nan" in (tmp_path / "experiments.yaml").read_text()
    proc = snakemake(tmp_path)
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("Using workflow")]
    assert proc.returncode != 0 and said == ["convsweep: experiments.yaml:11: experiments.cpu-sweep.stopping."
                                             "max_noise: expected a finite number, got .nan"], said
    assert not (tmp_path / "results").exists() and not (tmp_path / "db").exists()


def test_a_store_is_known_by_its_stamp_and_reading_it_creates_nothing(tmp_path):
    from convsweep.app.plan import stamp_store, store_identity
    from convsweep.store import open_store

    url = f"sqlite:///{tmp_path / 'db' / 'results.sqlite'}"
    assert store_identity(url) is None and not (tmp_path / "db").exists()  # missing: read, not made
    engine = open_store(url)
    try:
        assert store_identity(url) is None  # made by hand, no stamp yet
        stamp_store(engine, 0x1234abcd)
        assert store_identity(url) == "stamp 1234abcd"
        stamp_store(engine, 7)  # a stamped store keeps its own
        assert store_identity(url) == "stamp 1234abcd"
    finally:
        engine.dispose()
    (tmp_path / "not-a-db.sqlite").write_text("hello " * 200)
    assert store_identity(f"sqlite:///{tmp_path / 'not-a-db.sqlite'}") is None  # check_store says why


def test_a_postgresql_database_made_again_is_another_store(empty_pg_url):
    from sqlalchemy.engine import make_url

    from convsweep.app.plan import store_identity

    first = store_identity(empty_pg_url)
    assert first is not None and first.startswith("postgresql oid ") and store_identity(empty_pg_url) == first
    name = make_url(empty_pg_url).database
    admin = create_engine(os.environ["CONVSWEEP_TEST_PG_URL"], isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    assert store_identity(empty_pg_url) not in (None, first)
    assert store_identity("postgresql://nobody@127.0.0.1:1/none") is None  # unreachable: check_store says so


# --- a machine without a GPU (issue 54) ----------------------------------------------------------

NO_GPU = {key: value for key, value in os.environ.items() if key != GPU_JOBS_ENV} | {"CUDA_VISIBLE_DEVICES": ""}
# The sweep below printed 10,068 bytes before issue 54 on a machine without a GPU (its 3 GPU jobs failed, each a
# block of Snakemake's with its command twice; the first word of the missing GPU in the table at its end), and
# 4,900 since: the GPU jobs are left out, and the block that says so is the first thing convsweep prints.
NO_GPU_BUDGET_BYTES = 7_000


def test_a_machine_without_a_gpu_says_so_first_runs_no_gpu_job_and_exits_1(tmp_path):
    """A fresh clone's `snakemake` on a machine without a GPU (issue 54: 38 GPU jobs failed one by one, 103 KB of
    terminal, the missing GPU named 15 minutes in): the first lines say what the machine has and what the sweep
    does, with the CPU sweep's command; no GPU job runs (nor its profile or confirmation); the end says what was
    not run and why, and the sweep exits 1, again the next time."""
    clone = copy_checkout(tmp_path / "clone")
    small_sweep(clone, {"mixed": {"variants": ["reference", "naive", "fused_conv_relu_pool"], "ncu": "auto"},
                        "gpu-only": {"variants": ["naive"]}})
    first = subprocess.run([SNAKEMAKE], capture_output=True, text=True, cwd=clone, env=NO_GPU, timeout=600)
    out = first.stdout + first.stderr
    assert first.returncode == 1, out[-3000:]
    lines = first.stderr.splitlines()
    block = next(i for i, line in enumerate(lines) if line.startswith("convsweep: "))
    assert block <= 3 and lines[block].startswith("convsweep: no NVIDIA GPU or driver on this machine (")
    assert "; nsys: " in lines[block] and "; ncu: " in lines[block]
    assert lines[block + 1] == ("  so this sweep runs its 1 job on the CPU and leaves out the 6 that need a GPU; its "
                                "end says what was not run, and `snakemake` exits 1")  # 3 runs, 2 profiles, a confirm
    assert lines[block + 2].startswith("  `snakemake --configfile sweeps/cpu.yaml` runs the CPU sweep alone")
    assert not any("rule " in line for line in lines[:block])  # said before any job
    assert [started(first, rule) for rule in ("run_job", "profile_kernels", "confirm_winners")] == [1, 0, 0]
    results = clone / "results"
    assert [p.name.split("-b")[0] for p in results.glob("*/runs/*.json")] == ["reference"]
    assert not [p for p in results.glob("*/logs/*") if "reference" not in p.name and p.stem not in ("ingest", "report")]
    assert len(out.encode()) < NO_GPU_BUDGET_BYTES, out

    mixed = first.stderr[first.stderr.index("convsweep: mixed: "):].splitlines()
    assert mixed[0] == "convsweep: mixed: 1 of 3 jobs finished; settings stored: 1 ok, 0 failed, 0 incorrect"
    rows = [line.split("  no NVIDIA GPU or driver on this machine (")[0].split() for line in mixed[3:6]]
    assert rows == [["2", "jobs", "not", "run"], ["2", "jobs", "profile", "not", "run"],
                    ["1", "job", "winners", "not", "run"]], mixed
    assert mixed[6:8] == ["  more: results/mixed/not-run.json", "  report over the 1 job that finished: "
                                                                   "results/mixed/report.md"], mixed
    assert "convsweep: gpu-only: 0 of 1 jobs finished; settings stored: 0 ok, 0 failed, 0 incorrect" in first.stderr
    assert "retries" not in first.stderr  # `snakemake` again would run nothing more here
    assert mixed[-1] == ("convsweep: 6 jobs were not run: `snakemake` on a machine with an NVIDIA GPU runs them; "
                         "`snakemake --configfile sweeps/cpu.yaml` runs the CPU sweep alone")
    from convsweep.analysis.outcome import NotRun

    not_run = NotRun.read(results / "mixed" / "not-run.json")
    assert not_run.reason.startswith("no NVIDIA GPU or driver on this machine (")
    assert sorted(kind for kind, _ in not_run.jobs) == ["profile", "profile", "run", "run", "winners"]
    specs = {p.stem for p in (results / "mixed" / "specs").glob("*.json")}
    assert {job_id for kind, job_id in not_run.jobs if kind == "run"} == \
        {job_id for job_id in specs if not job_id.startswith(("reference", "winners"))}

    again = subprocess.run([SNAKEMAKE], capture_output=True, text=True, cwd=clone, env=NO_GPU, timeout=600)
    assert again.returncode == 1 and started(again, "run_job") == 0, (again.stdout + again.stderr)[-3000:]
    assert "Nothing to be done" not in again.stderr and "convsweep: 6 jobs were not run: " in again.stderr


def test_a_failed_job_is_two_lines_and_verbose_brings_snakemakes_block_back(tmp_path):
    """A failed job's id, its reason and its log, where Snakemake printed a block and an exception that each held
    its whole command; `--verbose` asks for Snakemake's own output, which prints them as it always did."""
    small_sweep(tmp_path, {"e": {"variants": ["naive"]}})
    env = {**EVERY_JOB, "CUDA_VISIBLE_DEVICES": ""}
    brief = snakemake(tmp_path, env=env)
    log = next((tmp_path / "results" / "e" / "logs").glob("naive-*.log")).relative_to(tmp_path)
    lines = brief.stderr.splitlines()
    failed = [i for i, line in enumerate(lines) if line.startswith("convsweep: failed: ")]
    assert len(failed) == 1, brief.stderr[-3000:]
    assert lines[failed[0]].startswith(f"convsweep: failed: e/{log.stem}: no NVIDIA GPU or driver on this machine ")
    assert lines[failed[0] + 1] == f"  log: {log}" and len(lines[failed[0]]) < 160
    assert "RuleException" not in brief.stderr and "    shell:" not in brief.stderr and "run-job" not in brief.stderr
    assert "SNAKEMAKE\n=========" not in brief.stderr  # the host banner: in .snakemake/log/ alone
    verbose = snakemake(tmp_path, "--verbose", env=env)
    assert verbose.returncode != 0 and "Error in rule run_job:" in verbose.stderr, verbose.stderr[-3000:]
    assert "convsweep: failed: " not in verbose.stderr


@pytest.mark.parametrize("content, expected", [
    (None, "experiments.yaml: no such file in "), ("", "experiments.yaml: empty: "),
    ("# nothing yet\n", "experiments.yaml: empty: "),
    ("- naive\n", "experiments.yaml: a list, not a mapping: "),
])
def test_a_missing_or_empty_experiments_yaml_is_one_line(tmp_path, content, expected):
    """Snakemake's configfile directive said it in its own words (`WorkflowError in file Snakefile, line 18`)."""
    if content is not None:
        (tmp_path / "experiments.yaml").write_text(content)
    proc = snakemake(tmp_path, "--dry-run")
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("Using workflow")]
    assert proc.returncode != 0 and len(said) == 1 and said[0].startswith(f"convsweep: {expected}"), said


class FakeWorkflow:
    """What SweepPlan.left_out reads of Snakemake's workflow: where the jobs run, and whether it runs them."""

    def __init__(self, local_exec=True, remote_exec=False):
        self.local_exec, self.remote_exec, self.subprocess_exec = local_exec, remote_exec, False
        self.executor_plugin = object()  # a run (or a dry run): the plan says what it does
        self.output_settings = type("OutputSettings", (), {"quiet": set()})()


def machine(gpu: bool, nsys=None, ncu=None):
    from convsweep.device.provenance import Machine

    if gpu:
        return Machine(1, None, ("NVIDIA H100 80GB HBM3",), "550.54.15", nsys, ncu)
    return Machine(0, "no NVIDIA GPU or driver on this machine (cuInit: CUDA_ERROR_NO_DEVICE)", nsys=nsys, ncu=ncu)


def never_asked():
    raise AssertionError("the machine was probed")


MIXED = {"results_dir": "results", "experiments": {"e": {"variants": ["reference", "naive"], "batches": [8],
                                                         "ncu": "auto"}}}


def test_a_gpu_machine_runs_every_job_and_says_what_it_lacks(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(GPU_JOBS_ENV, raising=False)
    plan = SweepPlan(MIXED, ROOT / "experiments.yaml", workflow=FakeWorkflow(), probe=lambda: machine(True))
    assert plan.left_out is None
    assert len(plan.run_files("e")) == 2 and len(plan.profile_files("e")) == 1
    assert plan.targets() == ["results/e/ingested.json", "results/e/summary.md", "results/e/report.md"]
    assert capsys.readouterr().err.splitlines() == [
        "convsweep: this machine: NVIDIA H100 80GB HBM3, driver 550.54.15; nsys: not found; ncu: not found",
        "  so this sweep runs all of its jobs; without nsys, profiler: auto jobs are timed with CUDA events; "
        "without ncu, ncu: auto profiles are skipped"]
    plan.write_not_run()
    assert not (tmp_path / "results" / "e" / "not-run.json").exists()


def test_without_a_gpu_the_plan_leaves_the_gpu_jobs_out_but_where_a_cluster_runs_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(GPU_JOBS_ENV, raising=False)
    plan = SweepPlan(MIXED, ROOT / "experiments.yaml", workflow=FakeWorkflow(), probe=lambda: machine(False))
    assert plan.left_out == "no NVIDIA GPU or driver on this machine (cuInit: CUDA_ERROR_NO_DEVICE)"
    assert [Path(f).name.split("-b")[0] for f in plan.run_files("e")] == ["reference"]
    assert plan.profile_files("e") == [] and plan.result_folders("e") == ["results/e/runs"]
    assert plan.targets()[-1] == "results/not-run.flag"
    assert "leaves out the 2 that need a GPU" in capsys.readouterr().err
    plan.write_not_run()
    from convsweep.analysis.outcome import NotRun

    assert [kind for kind, _ in NotRun.read(tmp_path / "results" / "e" / "not-run.json").jobs] == ["run", "profile"]

    for workflow in (FakeWorkflow(local_exec=False), FakeWorkflow(remote_exec=True)):  # a cluster's nodes, a job step
        plan = SweepPlan(MIXED, ROOT / "experiments.yaml", workflow=workflow, probe=never_asked)
        assert plan.left_out is None and len(plan.run_files("e")) == 2
    monkeypatch.setenv(GPU_JOBS_ENV, "run")
    plan = SweepPlan(MIXED, ROOT / "experiments.yaml", workflow=FakeWorkflow(), probe=lambda: machine(False))
    assert plan.left_out is None and len(plan.run_files("e")) == 2
    assert "CONVSWEEP_GPU_JOBS=run: this sweep runs its 2 GPU jobs anyway" in capsys.readouterr().err
