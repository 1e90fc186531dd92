"""The rules' shell commands: no value from the config, a path or a wildcard is ever read as shell code."""
import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from checkout_copy import copy_checkout
from convsweep.app import plan as plan_module
from convsweep.base.paths import ROOT

SNAKEMAKE = shutil.which("snakemake")
RULE_FILES = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
# A results_dir that runs three commands if a shell reads it as code (the substitutions even where the
# command they are part of fails), and splits at its space if unquoted.
HOSTILE_RESULTS = "r$(touch DOLLAR)`touch BACKTICK`;touch SEMICOLON;res dir"
SENTINELS = ("SEMICOLON", "DOLLAR", "BACKTICK")


def shell_commands(path: Path) -> list[str]:
    """Each `shell:` directive's command in a Snakemake file: the string literals indented under it."""
    lines = path.read_text().splitlines()
    commands = []
    for index, line in enumerate(lines):
        if line.strip() != "shell:":
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for following in lines[index + 1:]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            body.append(following)
        commands.append(ast.literal_eval("(" + "\n".join(body) + ")"))
    return commands


def test_every_placeholder_of_every_shell_command_is_quoted():
    """`{output}` in a command is the path as it is; `{output:q}` is the path quoted for the shell."""
    commands = {path.name: shell_commands(path) for path in RULE_FILES}
    assert sum(map(len, commands.values())) >= 4, commands  # run, profile, ingest, report
    unquoted = [(name, placeholder) for name, found in commands.items() for command in found
                for placeholder in re.findall(r"(?<!\{)\{([^{}]*)\}(?!\})", command) if not placeholder.endswith(":q")]
    assert unquoted == []


def test_the_shell_prefix_quotes_the_checkout(tmp_path, monkeypatch):
    checkout = tmp_path / "clone; touch SEMICOLON; $(touch DOLLAR)"
    monkeypatch.setattr(plan_module, "ROOT", checkout)
    prefix = plan_module.SweepPlan.shell_prefix().replace("{{", "{").replace("}}", "}")
    proc = subprocess.run(["bash", "-c", prefix + "type convsweep"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert str(checkout) in proc.stdout
    assert [name for name in SENTINELS if (tmp_path / name).exists()] == []


def run_sweep(snakefile: Path, workdir: Path, results_dir: str) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "experiments.yaml").write_text(yaml.safe_dump({
        "db_url": "sqlite:///db/results.sqlite", "results_dir": results_dir,
        "experiments": {"e": {"variants": ["reference"], "batches": [8], "repeats": 1, "warmup": 0,
                              "profiler": "events"}}}))
    return subprocess.run([SNAKEMAKE, "--snakefile", str(snakefile), "--directory", str(workdir), "--cores", "1"],
                          capture_output=True, text=True, timeout=600)


def assert_swept_in(workdir: Path, results_dir: str, proc: subprocess.CompletedProcess) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert (workdir / results_dir / "e" / "summary.md").is_file(), out[-3000:]
    assert "| reference" in (workdir / results_dir / "e" / "summary.md").read_text()
    assert sorted(p.name for p in workdir.iterdir()) == sorted([".snakemake", "db", "experiments.yaml", results_dir])


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_a_results_dir_of_shell_characters_runs_nothing(tmp_path):
    """Given as the config has it, the value is refused with one line, or the sweep writes there; a shell
    never runs a word of it, and nothing lands beside it (a path cut at its space would)."""
    work = tmp_path / "work"
    proc = run_sweep(ROOT / "Snakefile", work, HOSTILE_RESULTS)
    assert [name for name in SENTINELS if (work / name).exists()] == []
    if proc.returncode != 0:
        said = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("Using workflow")]
        assert len(said) == 1 and re.match(r"convsweep: experiments\.yaml(:\d+)?: results_dir: ", said[0]), said
        assert not (work / HOSTILE_RESULTS).exists()
    else:
        assert_swept_in(work, HOSTILE_RESULTS, proc)


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed")
def test_the_rules_take_a_results_dir_of_shell_characters_as_a_path(tmp_path):
    """With the schema's pattern for paths taken out, the rules alone keep the value a path: the whole
    sweep (jobs, ingest, report) works in that directory and runs none of it."""
    checkout = copy_checkout(tmp_path / "checkout")
    schema_path = checkout / "workflow" / "schemas" / "experiments.schema.yaml"
    schema = yaml.safe_load(schema_path.read_text())
    schema["properties"]["results_dir"] = {"type": "string", "default": "results"}
    schema_path.write_text(yaml.safe_dump(schema, sort_keys=False))
    work = tmp_path / "work"
    proc = run_sweep(checkout / "Snakefile", work, HOSTILE_RESULTS)
    assert [name for name in SENTINELS if (work / name).exists()] == []
    assert_swept_in(work, HOSTILE_RESULTS, proc)
