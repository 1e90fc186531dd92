"""The CPU sweep through a real SLURM cluster (snakemake-executor-plugin-slurm) into PostgreSQL, as
docs/cluster.md runs it. .ci/run starts a single-node cluster with
.ci/start-slurm.sh and a PostgreSQL server with .ci/start-postgres.sh; without either this skips."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from convsweep.base.paths import ROOT
from convsweep.app.plan import SweepPlan
from store_fixtures import as_reader

SLURM_ENV = "CONVSWEEP_TEST_SLURM"
EXPERIMENTS = {
    "results_dir": "results",
    "experiments": {
        "cpu-slurm": {
            "network": "networks/lenet86.yaml",
            "variants": ["reference"],
            "batches": [8, 16],
            "repeats": 2,
            "warmup": 0,
            "profiler": "events",
        }
    },
}
# This test cluster has no accounting database, so sacct knows no jobs: squeue reports them
# (start-slurm.sh keeps finished jobs there for 10 minutes). A first status check after 1 s instead
# of the plugin's 40 keeps the test short.
TEST_CLUSTER_ARGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
                     "--seconds-between-status-checks", "1"]


def slurm_is_up() -> str | None:
    """Why the SLURM test cannot run here, or None when it can."""
    if os.environ.get(SLURM_ENV) != "1":
        return f"no SLURM cluster: set {SLURM_ENV}=1 (.ci/run starts one with .ci/start-slurm.sh)"
    if shutil.which("snakemake") is None:
        return "snakemake is not installed"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed (pip install -e '.[slurm]')"
    if shutil.which("sinfo") is None:
        return "sinfo not found: SLURM's client commands are not installed"
    sinfo = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if sinfo.returncode != 0 or not {"idle", "mixed", "allocated"} & set(sinfo.stdout.split()):
        return f"SLURM does not answer: sinfo said {(sinfo.stdout + sinfo.stderr).strip()[:200]!r}"
    return None


@pytest.fixture
def slurm_cluster():
    """Skips with the reason when there is no cluster (before a PostgreSQL database is made)."""
    why = slurm_is_up()
    if why:
        pytest.skip(why)


def test_cpu_sweep_through_slurm_into_postgresql(slurm_cluster, tmp_path: Path, empty_pg_url: str):
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(EXPERIMENTS))
    plan = SweepPlan(EXPERIMENTS, tmp_path / "experiments.yaml")
    settings = sum(len(job.runs()) for job in plan.jobs)
    env = {**os.environ, "CONVSWEEP_DB": empty_pg_url}
    cmd = [shutil.which("snakemake"), "--profile", "profiles/slurm", "--workflow-profile", "none",
           "--directory", str(tmp_path), *TEST_CLUSTER_ARGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # Every job went through sbatch; the plugin names each SLURM log after its rule.
    submitted = [line for line in out.splitlines() if "has been submitted with SLURM jobid" in line]
    assert sum("/rule_run_job/" in line for line in submitted) == len(plan.jobs), out[-4000:]
    assert sum("/rule_ingest_results/" in line for line in submitted) == 1, out[-4000:]

    engine = create_engine(empty_pg_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT run_key, status FROM run")).all()
    finally:
        engine.dispose()
    assert len(rows) == settings == 2
    assert len({r.run_key for r in rows}) == len(rows)  # each run stored once
    assert {r.status for r in rows} == {"ok"}

    query = subprocess.run([sys.executable, "-m", "convsweep.app.cli", "query", "summary", "--db", as_reader(empty_pg_url)],
                           capture_output=True, text=True, cwd=ROOT)
    assert query.returncode == 0, query.stderr
    assert query.stdout.count("reference") == settings, query.stdout

    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]
