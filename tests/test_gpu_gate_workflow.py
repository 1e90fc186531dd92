"""The GPU regression gate (.github/workflows/gpu-regressions.yml) runs a pull request's code on a
self-hosted runner: each property that keeps it safe on a public repository is one test here, so a
regression names itself (docs/gpu-gate.md says why each holds)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOW_PATH = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "gpu-regressions.yml"
LABEL = "gpu-gate"
RUN_DIR_PREFIX = "${{ runner.temp }}/"
BASE_SHA = "${{ github.event.pull_request.base.sha }}"
HEAD_SHA = "${{ github.event.pull_request.head.sha }}"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW_PATH.read_text())


@pytest.fixture(scope="module")
def job(workflow) -> dict:
    (only,) = workflow["jobs"].values()
    return only


@pytest.fixture(scope="module")
def steps(job) -> list[dict]:
    return job["steps"]


def measuring_step(steps: list[dict], commit: str) -> tuple[int, dict]:
    """The step that measures `commit` (base or head), and its index."""
    found = [(i, step) for i, step in enumerate(steps) if step.get("env", {}).get("COMMIT") == commit]
    assert len(found) == 1, f"expected one step with COMMIT: {commit}, found {len(found)}"
    return found[0]


def run_dir(steps: list[dict]) -> str:
    """The run's directory, as the last (always) step removes it."""
    return steps[-1]["env"]["GATE_DIR"]


# --- who may start it ----------------------------------------------------------------------------

def test_only_pull_request_target_triggers_it(workflow):
    """pull_request would read the workflow, and so the fork condition, from the pull request itself."""
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert set(triggers) == {"pull_request_target"}
    assert set(triggers["pull_request_target"]["types"]) == {"opened", "synchronize", "reopened", "labeled"}


class Expression:
    """The subset of GitHub's expression language a job's `if:` uses here: literals, context paths,
    ==, !=, !, &&, || and parentheses; string equality ignores case, as GitHub's does."""
    TOKEN = re.compile(r"\s*(?:('(?:[^']|'')*')|(==|!=|&&|\|\||[()!])|([A-Za-z_][A-Za-z0-9_.-]*))")

    def __init__(self, text: str):
        self.tokens, position = [], 0
        text = text.strip()
        while position < len(text):
            match = self.TOKEN.match(text, position)
            if not match or match.end() == position:
                raise ValueError(f"unsupported expression at {text[position:]!r}")
            self.tokens.append(match.groups())
            position = match.end()

    def evaluate(self, context: dict):
        self.context, self.position = context, 0
        value = self._or()
        if self.position != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.position]}")
        return value

    def _peek(self, op: str) -> bool:
        return self.position < len(self.tokens) and self.tokens[self.position][1] == op

    def _or(self):
        value = self._and()
        while self._peek("||"):
            self.position += 1
            right = self._and()
            value = value or right
        return value

    def _and(self):
        value = self._unary()
        while self._peek("&&"):
            self.position += 1
            right = self._unary()
            value = value and right
        return value

    def _unary(self):
        if self._peek("!"):
            self.position += 1
            return not self._unary()
        left = self._primary()
        if self._peek("==") or self._peek("!="):
            negate = self.tokens[self.position][1] == "!="
            self.position += 1
            right = self._primary()
            if isinstance(left, str) and isinstance(right, str):
                left, right = left.lower(), right.lower()
            return (left == right) != negate
        return left

    def _primary(self):
        string, op, name = self.tokens[self.position]
        self.position += 1
        if op == "(":
            value = self._or()
            assert self._peek(")"), "unbalanced parentheses"
            self.position += 1
            return value
        if string is not None:
            return string[1:-1].replace("''", "'")
        if name in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[name]
        if name is None:
            raise ValueError(f"unexpected {op!r}")
        value = self.context
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


def pr_event(action: str, head_repo: str | None, label: str | None = None) -> dict:
    event = {"action": action, "pull_request": {"number": 7, "head": {"repo": head_repo and {"full_name": head_repo}}}}
    if label is not None:
        event["label"] = {"name": label}
    return {"vars": {"CONVSWEEP_GPU_RUNNER": "true"},
            "github": {"repository": "lab/convsweep", "event_name": "pull_request_target", "event": event}}


@pytest.mark.parametrize("context, runs", [
    (pr_event("opened", "lab/convsweep"), True),
    (pr_event("synchronize", "lab/convsweep"), True),
    (pr_event("reopened", "lab/convsweep"), True),
    (pr_event("labeled", "lab/convsweep", LABEL), True),  # a maintainer's rerun
    (pr_event("labeled", "lab/convsweep", "docs"), False),  # not a second run of the same push
    (pr_event("opened", "someone/convsweep"), False),
    (pr_event("synchronize", "someone/convsweep"), False),  # a push after the label: label it again
    (pr_event("labeled", "someone/convsweep", "docs"), False),
    (pr_event("labeled", "someone/convsweep", LABEL), True),
    (pr_event("synchronize", None), False),  # the fork was deleted
    ({**pr_event("synchronize", "lab/convsweep"), "vars": {}}, False),  # no GPU runner registered yet
], ids=["same-opened", "same-push", "same-reopened", "same-labelled", "same-other-label", "fork-opened",
        "fork-push", "fork-other-label", "fork-labelled", "fork-deleted", "no-runner"])
def test_forks_run_only_when_a_maintainer_labels_them(job, context, runs):
    assert bool(Expression(job["if"]).evaluate(context)) is runs


# --- what its token and its actions are ----------------------------------------------------------

def test_the_token_may_only_read_contents(workflow):
    assert workflow["permissions"] == {"contents": "read"}
    for name, each in workflow["jobs"].items():
        assert each.get("permissions", workflow["permissions"]) == {"contents": "read"}, name


def test_every_action_is_pinned_to_a_full_commit_sha(steps):
    uses = [step["uses"] for step in steps if "uses" in step]
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", ref), f"{ref} is not pinned to a commit"


def test_every_pin_names_its_tag():
    lines = [line for line in WORKFLOW_PATH.read_text().splitlines() if re.match(r"\s*-?\s*uses:", line)]
    assert lines
    for line in lines:
        assert re.search(r"@[0-9a-f]{40}\s+#\s*v\d+(\.\d+)*\s*$", line), f"no `# vX.Y.Z` after the pin: {line.strip()}"


def test_checkout_leaves_no_token_in_git_config(steps):
    checkouts = [step for step in steps if step.get("uses", "").startswith("actions/checkout@")]
    assert checkouts
    for step in checkouts:
        assert step.get("with", {}).get("persist-credentials") is False


def test_a_push_cancels_the_gate_of_the_push_before(workflow, job):
    # At the job, not the workflow: a run skipped by the `if:` (some other label) must cancel nothing.
    assert "concurrency" not in workflow
    assert "${{ github.event.pull_request.number }}" in job["concurrency"]["group"]
    assert job["concurrency"]["cancel-in-progress"] is True


# --- what a run reads and leaves -----------------------------------------------------------------

def test_the_run_directory_is_new_for_each_run(steps):
    gate_dir = run_dir(steps)
    assert gate_dir.startswith(RUN_DIR_PREFIX)
    assert "${{ github.run_id }}" in gate_dir and "${{ github.run_attempt }}" in gate_dir


@pytest.mark.parametrize("variable", ["CONVSWEEP_DB", "CONVSWEEP_CACHE", "HOME"])
def test_store_cache_and_home_are_under_the_run_directory(job, steps, variable):
    gate_dir = run_dir(steps)
    assert variable not in job.get("env", {}), f"{variable} set for the whole job, not per run"
    users = [step for step in steps if re.search(r"\b(snakemake|convsweep|pip)\b", step.get("run", ""))]
    assert len(users) == 3  # the base's sweep, the head's sweep, the comparison
    for step in users:
        value = step.get("env", {}).get(variable)
        assert value, f"{step['name']!r} runs without its own {variable}"
        path = value.removeprefix("sqlite:///") if variable == "CONVSWEEP_DB" else value
        assert path.startswith(gate_dir + "/"), f"{step['name']!r}: {variable}={value} is not under {gate_dir}"
        assert "../" not in path and "~" not in path and "github.workspace" not in path


def test_both_sides_and_the_comparison_use_one_store(steps):
    stores = {step["env"]["CONVSWEEP_DB"] for step in steps if "CONVSWEEP_DB" in step.get("env", {})}
    assert len(stores) == 1
    assert next(iter(stores)).startswith("sqlite:///" + RUN_DIR_PREFIX)


def test_each_side_has_its_own_cache_and_home(steps):
    (_, base), (_, head) = measuring_step(steps, BASE_SHA), measuring_step(steps, HEAD_SHA)
    for variable in ("SIDE", "CONVSWEEP_CACHE", "HOME"):
        assert base["env"][variable] != head["env"][variable], variable


def test_the_run_directory_and_the_checkout_are_removed_whatever_happened(steps):
    last = steps[-1]
    assert last["if"] == "always()"
    # From expressions: the head's code may have rewritten the environment through $GITHUB_ENV.
    assert last["env"]["WORKSPACE"] == "${{ github.workspace }}"
    script = last["run"]
    assert re.search(r'^rm -rf "\$GATE_DIR"$', script, re.M)
    assert re.search(r'^find "\$WORKSPACE" -mindepth 1 -maxdepth 1 -exec rm -rf \{\} \+$', script, re.M)


def test_the_checkout_directory_starts_empty(steps):
    first_checkout = next(i for i, step in enumerate(steps) if step.get("uses", "").startswith("actions/checkout@"))
    before = " ".join(step.get("run", "") for step in steps[:first_checkout])
    assert re.search(r'find "\$GITHUB_WORKSPACE" -mindepth 1 -maxdepth 1 -exec rm -rf \{\} \+', before)


# --- how each side is measured -------------------------------------------------------------------

@pytest.mark.parametrize("commit", [BASE_SHA, HEAD_SHA], ids=["base", "head"])
def test_each_side_installs_its_own_worktree_into_its_own_venv(steps, commit):
    _, step = measuring_step(steps, commit)
    lines = [line.strip() for line in step["run"].splitlines() if line.strip()]
    expected_in_order = [
        r'git worktree add --detach "\$SIDE/src" "\$COMMIT"',
        r'python3 -m venv "\$SIDE/\.venv"',
        r'"\$SIDE/\.venv/bin/pip" install -q -e "\$SIDE/src"',
        r'cd "\$SIDE/src"',
        r'PATH="\$SIDE/\.venv/bin:\$PATH" snakemake( .*)?',
    ]
    positions = []
    for pattern in expected_in_order:
        found = [i for i, line in enumerate(lines) if re.fullmatch(pattern, line)]
        assert found, f"{step['name']!r} lacks a line matching {pattern}"
        positions.append(found[0])
    assert positions == sorted(positions), f"{step['name']!r}: worktree, venv, install, cd, sweep out of order"


def test_base_and_head_are_measured_by_the_same_lines(steps):
    (_, base), (_, head) = measuring_step(steps, BASE_SHA), measuring_step(steps, HEAD_SHA)
    assert base["run"] == head["run"]


def test_the_base_is_measured_before_any_of_the_heads_code_runs(steps):
    (base_at, _), (head_at, _) = measuring_step(steps, BASE_SHA), measuring_step(steps, HEAD_SHA)
    assert base_at < head_at
    # Checking the head out runs none of its code; nothing else before the base's step may touch it.
    for step in steps[:base_at]:
        assert "pip" not in step.get("run", "") and "snakemake" not in step.get("run", ""), step.get("name")


def test_compare_runs_the_heads_own_convsweep_after_both_sides(steps):
    (_, _), (head_at, head) = measuring_step(steps, BASE_SHA), measuring_step(steps, HEAD_SHA)
    compare_at = next(i for i, step in enumerate(steps) if "convsweep compare" in step.get("run", ""))
    assert compare_at > head_at
    compare = steps[compare_at]
    assert compare["working-directory"] == head["env"]["SIDE"]
    assert re.match(r'\.venv/bin/convsweep compare "\$BASE" "\$HEAD" --fail-on slower', compare["run"])
    assert "pipefail" in compare["shell"]  # tee must not hide compare's exit status
