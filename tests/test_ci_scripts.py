"""The CI scripts under .ci/: `.ci/run` stops the servers it started however it ends, the start scripts'
`stop` leaves no daemon behind, and what a README command leaves in the checkout is ignored by git."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from convsweep.base.paths import ROOT

CI = ROOT / ".ci"
BASH = shutil.which("bash") or "/bin/bash"


def script(name: str, *args: str, tmpdir: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmpdir), "PATH": path if path is not None else os.environ["PATH"]}
    return subprocess.run([BASH, str(CI / name), *args], env=env, capture_output=True, text=True, timeout=120)


def processes_naming(text: str) -> list[int]:
    """The pids whose command line mentions `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return pids


@pytest.fixture
def shared_tmpdir():
    """A TMPDIR of the test's own that PostgreSQL's OS user can enter when the tests run as root (the start
    script then runs the server as `postgres`, and pytest's tmp_path lies below a directory only root enters)."""
    path = Path(tempfile.mkdtemp(prefix="convsweep-ci-"))
    path.chmod(0o755)
    yield path
    for pid in processes_naming(f"{path}/"):  # a server the script failed to stop: the test failed, leak nothing
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    shutil.rmtree(path, ignore_errors=True)


def only_tools(folder: Path, *names: str) -> str:
    """A PATH of `names` alone: a script that ignored its `stop` could start nothing (no initdb, apt-get, id)."""
    folder.mkdir()
    for name in names:
        (folder / name).symlink_to(shutil.which(name))
    return str(folder)


@pytest.mark.skipif(shutil.which("initdb") is None, reason="no initdb on PATH: start-postgres.sh starts no server")
def test_start_postgres_stop_leaves_no_server_of_its_data_directory(shared_tmpdir):
    started = script("start-postgres.sh", tmpdir=shared_tmpdir)
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.splitlines()[-1]
        assert url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
        directory, port = (shared_tmpdir / "convsweep-test-pg.state").read_text().split()
        data = f"{directory}/data"
        assert url.endswith(f":{port}/convsweep_test") and processes_naming(data)
        again = script("start-postgres.sh", tmpdir=shared_tmpdir)
        assert again.stdout.splitlines()[-1] == url  # idempotent: the same server
        assert script("start-postgres.sh", "status", tmpdir=shared_tmpdir).returncode == 0
    finally:
        stopped = script("start-postgres.sh", "stop", tmpdir=shared_tmpdir)
    assert (stopped.returncode, stopped.stdout) == (0, ""), stopped.stderr
    assert processes_naming(data) == []
    assert not Path(directory).exists() and not (shared_tmpdir / "convsweep-test-pg.state").exists()
    assert script("start-postgres.sh", "status", tmpdir=shared_tmpdir).returncode == 1
    assert script("start-postgres.sh", "stop", tmpdir=shared_tmpdir).returncode == 0  # nothing left to stop


@pytest.mark.parametrize("name", ["start-postgres.sh", "start-slurm.sh"])
def test_status_and_stop_without_the_tools_or_a_server_say_nothing_is_up(name, tmp_path):
    """Where the tools are missing the start scripts print nothing (the tests skip); .ci/run still asks them to
    stop at its end, which must then do nothing and succeed."""
    empty = only_tools(tmp_path / "bin")
    for args, returncode in ((("status",), 1), (("stop",), 0)):
        proc = script(name, *args, tmpdir=tmp_path, path=empty)
        assert (proc.returncode, proc.stdout, proc.stderr) == (returncode, "", ""), args
    assert script(name, "restart", tmpdir=tmp_path, path=empty).returncode == 2


@pytest.mark.skipif(Path("/etc/slurm/slurm.conf").exists(), reason="this machine has a slurm.conf: stop could remove it")
def test_start_slurm_stop_ends_the_daemons_its_pid_files_name(tmp_path):
    """Stand-ins named slurmd and slurmctld (a process's name is its program's) with their pid files where
    start-slurm.sh writes them; a pid file naming another program's process is left alone."""
    cluster = tmp_path / "convsweep-slurm.test"
    cluster.mkdir()
    daemons = {}
    for name in ("slurmd", "slurmctld", "bystander"):
        program = tmp_path / name
        shutil.copy(shutil.which("sleep"), program)
        daemons[name] = subprocess.Popen([str(program), "300"])
    try:
        for name in ("slurmd", "slurmctld"):
            (cluster / f"{name}.pid").write_text(f"{daemons[name].pid}\n")
        (tmp_path / "convsweep-test-slurm.state").write_text(f"{cluster}\n")
        (cluster / "munged.pid").write_text(f"{daemons['bystander'].pid}\n")  # not where start-slurm looks
        stopped = script("start-slurm.sh", "stop", tmpdir=tmp_path,
                         path=only_tools(tmp_path / "bin", "cat", "grep", "head", "rm", "seq", "sleep"))
        assert (stopped.returncode, stopped.stdout) == (0, ""), stopped.stderr
        assert daemons["slurmd"].wait(timeout=5) == daemons["slurmctld"].wait(timeout=5) == -15  # SIGTERM
        assert daemons["bystander"].poll() is None
        assert not cluster.exists() and not (tmp_path / "convsweep-test-slurm.state").exists()
    finally:
        for process in daemons.values():
            process.kill()
            process.wait()


FAKE_START = """#!/usr/bin/env bash
echo "{name} ${{1:-start}}" >>"$CI_LOG"
case "${{1:-start}}" in
    status) [ "${{{up}:-0}}" = 1 ] ;;
    start) echo "{printed}" ;;
esac
"""
FAKE_TOOLS = {  # what .ci/run calls besides the start scripts, each doing nothing but being logged
    "python3": 'echo "python3 $*" >>"$CI_LOG"; [ "$1 $2" != "-m venv" ] || mkdir -p "$3/bin"',
    "python": 'echo "python $*" >>"$CI_LOG"; [ "$1" != -c ] || echo /fake/venv',
    "snakemake": 'echo "snakemake $*" >>"$CI_LOG"; exit "${SWEEP_RC:-0}"',
    "pytest": 'echo "pytest $*" >>"$CI_LOG"; exit "${PYTEST_RC:-0}"',
    "ruff": 'echo "ruff $*" >>"$CI_LOG"',
    "mypy": 'echo "mypy $*" >>"$CI_LOG"',
    "chromium": "true",
    "chromedriver": "true",
}


def fake_checkout(tmp_path: Path) -> Path:
    """The real .ci/run in a folder whose start scripts, fresh-install check and tools are stand-ins that log."""
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(CI / "run", checkout / ".ci" / "run")
    for name, up, printed in (("postgres", "PG_UP", "postgresql+psycopg://postgres@127.0.0.1:1/convsweep_test"),
                              ("slurm", "SLURM_UP", "/etc/slurm/slurm.conf")):
        (checkout / ".ci" / f"start-{name}.sh").write_text(FAKE_START.format(name=name, up=up, printed=printed))
    (checkout / ".ci" / "check-fresh-install.sh").write_text('echo "fresh-install" >>"$CI_LOG"\n')
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, body in FAKE_TOOLS.items():
        (tools / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (tools / name).chmod(0o755)
    return checkout


@pytest.mark.parametrize("env, returncode, stopped", [
    ({}, 0, ["postgres", "slurm"]),
    ({"PYTEST_RC": "3"}, 3, ["postgres", "slurm"]),  # failing tests: the servers stop, the status stays
    ({"SWEEP_RC": "1"}, 1, ["postgres", "slurm"]),  # a failure before the tests ran
    ({"PG_UP": "1"}, 0, ["slurm"]),  # a developer's PostgreSQL, up before: reused, left running
    ({"PG_UP": "1", "SLURM_UP": "1"}, 0, []),
])
def test_ci_run_stops_the_servers_it_started_however_it_ends(tmp_path, env, returncode, stopped):
    checkout = fake_checkout(tmp_path)
    log = tmp_path / "calls.log"
    run_env = {**os.environ, **env, "CI_LOG": str(log), "TMPDIR": str(tmp_path),
               "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([BASH, str(checkout / ".ci" / "run")], env=run_env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == returncode, proc.stderr
    calls = log.read_text().splitlines()
    assert [call.split()[0] for call in calls if call.endswith(" stop")] == stopped
    last_work = max(i for i, call in enumerate(calls) if call.split()[0] in ("snakemake", "pytest"))
    assert all(calls.index(f"{name} stop") > last_work for name in stopped)  # at the end, not before
    assert calls.index("postgres status") < calls.index("postgres start")  # asked before starting


def test_ci_run_stops_the_servers_when_it_is_terminated(tmp_path):
    checkout = fake_checkout(tmp_path)
    (tmp_path / "bin" / "pytest").write_text('#!/usr/bin/env bash\necho "pytest" >>"$CI_LOG"\nexec sleep 30\n')
    log = tmp_path / "calls.log"
    run_env = {**os.environ, "CI_LOG": str(log), "TMPDIR": str(tmp_path),
               "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.Popen([BASH, str(checkout / ".ci" / "run")], env=run_env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # until the tests are running
            if log.exists() and "pytest" in log.read_text().split():
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)  # as a CI runner cancels a job: SIGTERM to its process group
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [call for call in log.read_text().splitlines() if call.endswith(" stop")] == ["postgres stop", "slurm stop"]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: git check-ignore has no .gitignore to read")
def test_the_report_snakemake_writes_at_the_root_is_ignored_and_only_there():
    """docs/results.md: `snakemake --report report.html` writes a self-contained page of several MB into the root."""
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path]).returncode == 0

    assert ignored("report.html") and ignored("sweep-2.html") and ignored("report.zip")
    assert not ignored("docs/page.html") and not ignored("kernels/report.html")
