"""convsweep runs from its checkout: a copy of the package without it is refused up front with one
line, and a sweep runs the convsweep and kernels of the checkout its Snakefile is in."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from checkout_copy import copy_checkout
from convsweep.base.paths import ROOT

SNAKEMAKE = shutil.which("snakemake")


def test_a_non_editable_install_is_refused_with_one_line(tmp_path):
    """`pip install .` copies the package alone (no kernels, registry, queries or migrations)."""
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    assert (site / "convsweep" / "app" / "cli.py").is_file() and not (site / "kernels").exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    for command in (["query", "--list"], ["compile", "naive", "--arch", "sm_90"]):
        proc = subprocess.run([sys.executable, "-m", "convsweep", *command], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith(f"convsweep: {site / 'convsweep'} is not in a convsweep checkout")
        assert "pip install -e ." in proc.stderr


def test_a_job_of_another_checkout_is_refused_naming_both(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "convsweep", "--checkout", str(tmp_path), "query", "--list"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"convsweep: the sweep was planned from the checkout {tmp_path.resolve()}, but this convsweep is "
        f"{ROOT / 'convsweep'}: run the Snakefile of the checkout convsweep is installed from, or "
        f"`pip install -e {tmp_path.resolve()}`"]


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_a_snakefile_plans_and_runs_its_own_checkout(tmp_path):
    """convsweep is installed (editable) from ROOT; the Snakefile of another clone plans with that
    clone's package and kernels, and its rules run that clone's convsweep (each job passes
    --checkout, so one that ran ROOT's would fail)."""
    clone = copy_checkout(tmp_path / "clone")
    work = tmp_path / "work"
    work.mkdir()
    (work / "experiments.yaml").write_text(yaml.safe_dump({"experiments": {"e": {
        "network": "networks/lenet86.yaml", "variants": ["reference", "naive"], "batches": [8], "repeats": 1,
        "warmup": 0, "profiler": "events"}}}))
    env = {**os.environ, "CONVSWEEP_GPU_JOBS": "run"}  # planned and run as on a GPU machine, without one too
    plan = subprocess.run([SNAKEMAKE, "--snakefile", str(clone / "Snakefile"), "--directory", str(work), "-n",
                           "--cores", "1"], capture_output=True, text=True, timeout=300, env=env)
    out = plan.stdout + plan.stderr
    assert plan.returncode == 0, out[-3000:]
    assert f"{clone}/kernels/naive.cu" in out and f"{ROOT}/kernels/" not in out
    run = subprocess.run([SNAKEMAKE, "--snakefile", str(clone / "Snakefile"), "--directory", str(work), "--cores", "1",
                          "--until", "ingest_results"], capture_output=True, text=True, timeout=600, env=env)
    results = [json.loads(p.read_text()) for p in (work / "results" / "e" / "runs").glob("*.json")]
    ran = sorted(r["job"]["variants"]["conv1"] for r in results)
    if ran == ["reference"]:  # a machine without a GPU: the naive job got as far as opening one, in the clone's code
        assert run.returncode != 0
        log = next((work / "results" / "e" / "logs").glob("naive-*.log")).read_text()
        assert "convsweep: no NVIDIA GPU or driver on this machine" in log and "planned from the checkout" not in log
    else:
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
        assert ran == ["naive", "reference"]


def test_the_rules_convsweep_is_this_checkouts_in_this_python_or_the_conda_env():
    from convsweep.app.plan import SweepPlan

    plain = SweepPlan.shell_prefix(())
    assert plain.startswith("set -euo pipefail; convsweep() {{ ")
    assert f"PYTHONPATH={ROOT}" in plain and f"{sys.executable} -m convsweep --checkout {ROOT} " in plain
    conda = SweepPlan.shell_prefix({"CONDA"})
    assert f" python -m convsweep --checkout {ROOT} " in conda and sys.executable not in conda


def _dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_the_plain_install_brings_what_snakemake_report_needs():
    """`snakemake --report` imports pygments, which only Snakemake's `reports` extra brings: README's
    `pip install -e . && snakemake --report report.html` failed with "pygments must be installed"."""
    from packaging.requirements import Requirement

    snakemake = [Requirement(d) for d in _dependencies() if Requirement(d).name == "snakemake"]
    assert snakemake and "reports" in snakemake[0].extras


def test_ci_installs_into_a_virtual_environment_and_runs_the_readme_in_its_order():
    """CI installs into a venv of its own, never the machine's interpreter, and runs README's two commands in
    README's order in one clone (the sweep leaves results/, a database and .snakemake/ behind before the tests
    run); its fresh-install check writes `snakemake --report`."""
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    first = {word: next(i for i, line in enumerate(steps) if word in line)
             for word in ("-m venv", 'export PATH="$venv/bin:$PATH"', "pip install", "snakemake --configfile", "pytest")}
    assert first["-m venv"] < first['export PATH="$venv/bin:$PATH"'] < first["pip install"]
    assert first["snakemake --configfile"] < first["pytest"] and steps[-1] == "pytest"
    assert "--report" in (ROOT / ".ci" / "check-fresh-install.sh").read_text()
