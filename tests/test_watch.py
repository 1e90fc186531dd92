"""`convsweep watch` on the CPU, in a copy of the checkout: a save re-measures exactly the jobs it changed and
compares them, a kernel that does not compile shows the compiler's line, a broken registry one line, and Ctrl-C
stops Snakemake mid-round with nothing half-written. One test, since each step needs the sweep before it."""
from __future__ import annotations

import json
import os
import queue
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

from checkout_copy import copy_checkout

pytestmark = pytest.mark.skipif(shutil.which("snakemake") is None, reason="snakemake is not installed")

ROUND_TIMEOUT_S = 120
BROKEN_KERNEL = ('#include "common.cuh"\nextern "C" __global__ void conv_forward(CONV_ARGS) {\n'
                 '  y[0] = undefined_name;\n}\n')
SWEEP = {"db_url": "sqlite:///db/results.sqlite", "experiments": {
    name: {"network": "networks/lenet86.yaml", "variants": variants, "batches": [8], "repeats": 2, "warmup": 0,
           "profiler": "events"}
    for name, variants in (("e", ["reference", "broken"]), ("other", ["reference"]))}}


def setup_checkout(tmp_path: Path) -> Path:
    """A copy of the checkout with a GPU variant whose kernel does not compile (its job finishes on any machine,
    its setting stored as failed with the compiler's line) and a sweep of it and the CPU reference."""
    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / "kernels" / "broken.cu").write_text(BROKEN_KERNEL)
    registry = yaml.safe_load((checkout / "kernels" / "variants.yaml").read_text())
    registry["broken"] = {**registry["naive"], "source": "broken.cu", "params": {}, "description": "a syntax error"}
    (checkout / "kernels" / "variants.yaml").write_text(yaml.safe_dump(registry))
    (checkout / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    return checkout


def edit_reference_entry(checkout: Path, constraint: str) -> None:
    """A constraint every shape meets: the entry's hash changes, so its jobs are measured again."""
    path = checkout / "kernels" / "variants.yaml"
    registry = yaml.safe_load(path.read_text())
    registry["reference"]["constraints"] = [constraint]
    path.write_text(yaml.safe_dump(registry))


class Watch:
    """`convsweep watch` as a process, its output read line by line on a thread."""

    def __init__(self, checkout: Path, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "convsweep", "watch", "--configfile", "sweep.yaml",
                                      "--experiment", "e", "--cores", "2", "--cpu"], cwd=checkout, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, done, timeout: float = ROUND_TIMEOUT_S) -> list[str]:
        """The lines up to and including the first for which `done` is true."""
        got, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("watch said no such line in time:\n" + "\n".join(self.seen[-40:])) from None
            if line is None:
                raise AssertionError("watch exited:\n" + "\n".join(self.seen[-40:]))
            got.append(line)
            self.seen.append(line)
            if done(line):
                return got

    def round(self) -> list[str]:
        """A round's lines: from the save it saw to the line saying it waits again."""
        lines = self.until(lambda line: line.startswith("saved: "))
        return lines + self.until(lambda line: line.startswith("watching "))

    def unread(self) -> list[str]:
        """What watch has said that no round read yet (for a failure's message)."""
        lines = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return lines
            lines.append("<exited>" if line is None else line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def running_job(checkout: Path, timeout: float = ROUND_TIMEOUT_S) -> bool:
    """Wait until a job of this checkout's sweep runs (its `convsweep run-job` process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"--checkout {checkout} run-job" in args:
                return True
        time.sleep(0.01)
    return False


def processes_in(checkout: Path) -> list[str]:
    """The processes whose working directory is the checkout (Snakemake and its jobs run there)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if Path(os.readlink(cwd)) == checkout:
                found.append((cwd.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="reads processes from /proc")
def test_watch_re_measures_a_save_compares_it_and_stops_cleanly(tmp_path):
    checkout = setup_checkout(tmp_path)
    env = {**os.environ, "CONVSWEEP_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(checkout),
           "CONVSWEEP_PROGRESS": "0",
           "CONVSWEEP_GPU_JOBS": "run"}  # its jobs fail without a GPU, as jobs, which is what it checks
    env.pop("CONVSWEEP_DB", None)
    first = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "sweep.yaml"],
                           cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    runs = {path.name.split("-")[0] + "/" + path.parent.parent.name: path
            for path in (checkout / "results").glob("*/runs/*.json")}
    assert sorted(runs) == ["broken/e", "reference/e", "reference/other"]

    watch = Watch(checkout, env)
    try:
        watch.until(lambda line: line.startswith("watching "))

        # A registry edit re-measures the reference's job of the watched experiment alone, and compares it.
        edit_reference_entry(checkout, "B >= 1")
        lines = watch.round()
        said = "\n".join(lines)
        measured = [line for line in lines if re.match(r"  \[\d+/\d+\] \S+: ", line)]
        assert len(measured) == 1 and measured[0].split("] ")[1].startswith(runs["reference/e"].stem), said
        assert "other" not in said  # neither run nor reported: --experiment e
        assert "A = previous, B = latest" in said, said
        table = [line for line in lines if line.startswith("| e ")]
        assert len(table) == 1 and "| reference " in table[0], said
        assert re.search(r"\| (SAME|FASTER|SLOWER|UNSURE|SUSPECT) ", table[0]), said

        # A kernel that still does not compile: its job is measured again, and the compiler's line is shown.
        kernel = checkout / "kernels" / "broken.cu"
        kernel.write_text(kernel.read_text() + "// edited\n")
        lines = watch.round()
        said = "\n".join(lines)
        measured = [line for line in lines if re.match(r"  \[\d+/\d+\] \S+: ", line)]
        assert len(measured) == 1 and measured[0].split("] ")[1].startswith(runs["broken/e"].stem), said
        assert 'kernels/broken.cu:3: identifier "undefined_name" is undefined' in said, said
        assert "compare: nothing to compare: no setting measured in this round was ok" in lines, said

        # A registry that does not parse: one line, no Snakemake; watch waits for the next save.
        registry = checkout / "kernels" / "variants.yaml"
        good = registry.read_text()
        registry.write_text(good + "reference: [unclosed\n")
        lines = watch.round()
        assert len(lines) == 3 and lines[1].startswith("convsweep: ") and "variants.yaml" in lines[1], lines
        registry.write_text(good)  # back as it was measured: nothing to do
        lines = watch.round()
        assert "  nothing to re-measure: every job is up to date with the files it depends on" in lines, lines

        # Ctrl-C while a job runs: Snakemake and its job stop, watch exits 0 with one line, nothing is
        # half-written, and `snakemake` again runs the job that was cut off.
        edit_reference_entry(checkout, "B >= 2")
        assert running_job(checkout), "\n".join(watch.seen[-20:] + ["(not yet read:)"] + watch.unread())
        watch.proc.send_signal(signal.SIGINT)
        assert watch.proc.wait(timeout=120) == 0
        rest = list(iter(watch.lines.get, None))
        assert rest and rest[-1].startswith("watch: stopped"), rest
        assert processes_in(checkout) == []
    finally:
        watch.stop()
    assert not [path for folder in ("results", "db", ".snakemake") for path in (checkout / folder).rglob("*.tmp")]
    for path in (checkout / "results").glob("*/runs/*.json"):
        json.loads(path.read_text())
    assert "Terminating processes on user request" in (checkout / ".snakemake" / "watch.log").read_text()
    again = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "sweep.yaml"],
                           cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0 and "--unlock" not in out, out[-3000:]
    assert f"wildcards: experiment=e, job={runs['reference/e'].stem}" in out, out[-3000:]
