"""`sanitize: true` without a GPU: compute-sanitizer's report read, its verdict on the setting, and a job on the
fake GPU with a stand-in compute-sanitizer on PATH (tests/test_redteam.py runs the real one on the device)."""
from __future__ import annotations

import os
import stat

from convsweep.sweep.config import RunSpec
from convsweep.measure.settings import measure
from convsweep.sweep.sanitize import find_sanitizer, read_report, sanitized_run, verdict

from fake_gpu import FAKE

MEMCHECK = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at conv_forward+0x2f0 in out_of_bounds.cu:20
=========     by thread (255,0,0) in block (39,15,0)
=========
========= ERROR SUMMARY: 1 error
"""


def run(**over) -> RunSpec:
    base = dict(experiment="t", network="networks/lenet86.yaml", dataset="mnist5k",
                variants={"conv1": "naive", "conv2": "naive"}, params={"conv1": {}, "conv2": {}}, batch=8, streams=1,
                host_memory="pageable", repeats=3, warmup=1, profiler="events")
    return RunSpec(**{**base, **over})


def test_the_report_gives_the_error_count_and_the_first_error():
    assert read_report(MEMCHECK) == {"errors": 1, "first": "Invalid __global__ write of size 4 bytes"}
    assert read_report("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == {"errors": 0,
                                                                                          "first": None}
    assert read_report("Segmentation fault")["errors"] is None  # no summary: it did not finish


def test_an_error_is_the_settings_verdict_and_none_is_none():
    found = {"memcheck": {"errors": 0, "first": None}, "initcheck": {"errors": 2, "first": "Uninitialized read"}}
    assert verdict(found) == "compute-sanitizer initcheck: 2 errors; the first: Uninitialized read"
    assert verdict({"memcheck": {"errors": 0, "first": None}, "initcheck": {"errors": 0, "first": None}}) is None
    assert verdict({"problem": "compute-sanitizer is not installed here"}) is None


def test_the_sanitized_pass_is_one_checked_pass_with_events_and_never_sanitizes_itself():
    sanitized = sanitized_run(run(sanitize=True, repeats=20, profiler="nsys"))
    assert (sanitized.repeats, sanitized.warmup, sanitized.profiler, sanitized.checks, sanitized.sanitize) == \
        (1, 1, "events", "fast", False)
    assert "sanitize" in run(sanitize=True).to_dict() and "sanitize" not in run().to_dict()  # old hashes kept


def test_without_compute_sanitizer_the_measurement_says_so_and_keeps_its_verdict(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert find_sanitizer() is None
    m = measure(run(sanitize=True), backend=FAKE)
    assert m.status == "ok" and "not installed" in m.integrity.sanitizer["problem"]


def test_what_compute_sanitizer_finds_makes_the_setting_incorrect(monkeypatch, tmp_path):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/sh\ncat <<'END'\n" + MEMCHECK + "END\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    m = measure(run(sanitize=True), backend=FAKE)
    assert m.status == "incorrect"
    assert m.error == "compute-sanitizer memcheck: 1 errors; the first: Invalid __global__ write of size 4 bytes"
    assert set(m.integrity.sanitizer) == {"memcheck", "initcheck"}


def test_the_sanitized_pass_is_measured_in_the_sanitized_process_with_padding_and_no_deadline(monkeypatch):
    """--worker: no watcher between compute-sanitizer and the kernels, and no heartbeat, so no deadline cuts a pass
    the sanitizer slows a hundredfold (its own TIMEOUT_S bounds it); --padding: a write just past a pool buffer lands
    in no other (redteam_out_of_bounds passed memcheck without it on the lent H100)."""
    import subprocess

    from convsweep.base.heartbeat import HEARTBEAT_ENV
    from convsweep.sweep import sanitize

    monkeypatch.setenv(HEARTBEAT_ENV, "/tmp/a-watchers-file")
    seen = []

    def fake_run(command, **kwargs):
        seen.append((command, kwargs["env"]))
        return subprocess.CompletedProcess(command, 0, "========= ERROR SUMMARY: 0 errors\n", "")

    monkeypatch.setattr(sanitize.subprocess, "run", fake_run)
    found = sanitize.sanitize(run(), sanitizer="/usr/local/cuda/bin/compute-sanitizer")
    assert found == {tool: {"errors": 0, "first": None} for tool in sanitize.TOOLS}
    for command, env in seen:
        assert command[command.index("--padding") + 1] == str(sanitize.PADDING_BYTES)
        assert command[-1] == "--worker" and command[command.index("-m") + 1:][:2] == ["convsweep", "run-job"]
        assert HEARTBEAT_ENV not in env
