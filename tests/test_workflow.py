"""A real Snakemake sweep on the CPU (the reference variant), into SQLite and PostgreSQL.

On a machine with a GPU the naive jobs run too; without one they are stored as failed runs,
which is also what the sweep must do: record the failure and go on.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from convsweep.config import ROOT

SNAKEMAKE = shutil.which("snakemake")
pytestmark = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")


def sweep_config(url: str) -> dict:
    return {
        "db_url": url,
        "results_dir": "results",
        "experiments": {
            "cpu-sweep": {
                "network": "networks/lenet86.yaml",
                "variants": ["reference", "naive"],
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


def runs(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT run_key, variant, batch, status, error FROM run ORDER BY variant, batch")).all()
    finally:
        engine.dispose()


def check_sweep(tmp_path: Path, config_db_url: str, env=None):
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(sweep_config(config_db_url)))
    url = (env or {}).get("CONVSWEEP_DB", config_db_url)
    first = snakemake(tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = runs(url)
    assert len(rows) == 4
    ref = [r for r in rows if r.variant == "reference"]
    assert [r.status for r in ref] == ["ok", "ok"]
    for r in rows:
        if r.variant == "naive":
            assert r.status == "ok" or "CUDA device" in r.error
    summary = (tmp_path / "results" / "cpu-sweep" / "summary.md").read_text()
    assert "| reference" in summary

    # As an interruption leaves it: one job's result never written, ingest and report never run.
    # The rerun redoes only that job, then ingests all four without duplicating the three stored.
    exp_dir = tmp_path / "results" / "cpu-sweep"
    for path in [*exp_dir.glob("runs/reference-b16-*.json"), exp_dir / "ingested.json", exp_dir / "summary.md"]:
        path.unlink()
    again = snakemake(tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("rule run_job:") == 1
    assert json.loads((exp_dir / "ingested.json").read_text())["unchanged"] == 4  # the lost job's row was already stored
    assert sorted(r.run_key for r in runs(url)) == sorted(r.run_key for r in rows)  # nothing duplicated

    nothing = snakemake(tmp_path, env=env)
    assert "Nothing to be done" in nothing.stdout + nothing.stderr


def test_cpu_sweep(tmp_path, db_url):
    """SQLite through db_url in the config; PostgreSQL through CONVSWEEP_DB, which wins over it."""
    if db_url.startswith("sqlite"):
        check_sweep(tmp_path, db_url)
    else:
        env = {**os.environ, "CONVSWEEP_DB": db_url}
        check_sweep(tmp_path, "sqlite:///unused.sqlite", env=env)
        assert not (tmp_path / "unused.sqlite").exists()
    query = subprocess.run([sys.executable, "-m", "convsweep.cli", "query", "summary", "--db", db_url],
                           capture_output=True, text=True)
    assert query.returncode == 0 and "reference" in query.stdout, query.stderr


def test_lint_is_clean():
    out = subprocess.run([SNAKEMAKE, "--lint", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Lints for" not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("experiment, expected", [
    ({"variants": ["naive"], "batches": [100], "streamz": [1]}, "experiments.e: unknown key ('streamz' was unexpected)"),
    ({"variants": ["nieve"], "batches": [100]}, "experiments.e.variants[0]: unknown variant 'nieve'"),
])
def test_bad_config_stops_the_workflow_with_one_line(tmp_path, experiment, expected):
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump({"experiments": {"e": experiment}}))
    proc = snakemake(tmp_path, "--dry-run")
    assert proc.returncode != 0
    assert f"experiments.yaml: {expected}" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_a_configfile_replaces_the_default_sweep(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"experiments": {"only-this": {"variants": ["reference"], "batches": [8]}}}))
    proc = subprocess.run([SNAKEMAKE, "--dry-run", "--configfile", str(other), "--cores", "1"],
                          capture_output=True, text=True, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "only-this" in out and "lenet86-baseline" not in out
