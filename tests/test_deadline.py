"""A job's deadlines without a GPU (convsweep.measure.deadline): workers that hang are killed with their process
group at the limit of what they said they were doing, the hung setting is stored as `timeout`, and a new worker
finishes the job. The workers here are small scripts that beat as a job does; the last test's second worker is
the real `convsweep run-job --worker` of a CPU reference job."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from convsweep.analysis.query import run_query
from convsweep.base import heartbeat
from convsweep.base.strict_json import read_json
from convsweep.measure import deadline
from convsweep.measure.deadline import Hung, Watch, supervise, watch
from convsweep.measure.record import ResultFile
from convsweep.store import ingest_files, open_store

from store_fixtures import as_reader
from test_job import spec

# A worker that says `beats` (lines "what setting"), starts a grandchild in its group, and then waits `then_s`.
WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    beats, then_s, code, pid_file = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(pid_file, "w").write(str(child.pid))
    fd = os.open(os.environ["CONVSWEEP_HEARTBEAT"], os.O_WRONLY | os.O_APPEND)
    for line in beats.split(";"):
        os.write(fd, (line + "\\n").encode())
    time.sleep(then_s)
    child.kill()
    sys.exit(code)
""")


def worker(tmp_path, beats: str, then_s: float, code: int = 0) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [sys.executable, str(script), beats, str(then_s), str(code), str(tmp_path / "grandchild.pid")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_watch_holds_each_beat_to_its_own_limit(tmp_path):
    now = [0.0]
    beats = tmp_path / "beats"
    beats.write_bytes(b"")
    state = Watch(os.open(beats, os.O_RDONLY), deadline_s=2.0, clock=lambda: now[0])

    def say(text: bytes, at: float) -> None:
        with open(beats, "ab") as f:
            f.write(text)
        now[0] = at
        state.read()

    now[0] = 1e6
    assert state.overdue() is None  # nothing said yet: opening the GPU, the truth (no limit)
    say(b"compile \n", 10.0)
    now[0] = 10.0 + deadline.COMPILE_CAP_S - 1
    assert state.limit() == deadline.COMPILE_CAP_S and state.overdue() is None
    say(b"compiled \nsetting 3\npa", 20.0)  # a line cut in two by the reader: its rest comes next
    assert (state.what, state.setting) == ("setting", 3)
    say(b"ss \n", 21.0)
    assert state.what == "pass"
    say(b'gpu {"gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-1", "packages": {}}\n', 21.0)  # not a step
    assert state.what == "pass" and state.gpu == {"gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-1"}
    now[0] = 22.9
    assert state.overdue() is None
    now[0] = 23.5
    assert state.overdue() == Hung("pass", 3, 2.5, {"gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-1"})
    say(b"gpu not json\n", 23.5)
    assert state.gpu is None
    say(b"wait \n", 24.0)
    now[0] = 1e6
    assert state.overdue() is None  # between settings, sanitizing: no kernel of the job's is running


def test_a_worker_hung_in_a_pass_is_killed_at_its_deadline_with_everything_it_started(tmp_path):
    started = time.monotonic()
    status, hung = watch(worker(tmp_path, "compile ;compiled ;setting 2;pass ", then_s=60), deadline_s=0.6)
    took = time.monotonic() - started
    assert hung is not None and (hung.what, hung.setting) == ("pass", 2) and hung.seconds > 0.6
    assert status == -9 and took < 10, took  # SIGKILL, at its deadline and not the 60 s it would have slept
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    for _ in range(50):  # the group's SIGKILL reaches it; its parent (the worker) is gone, so init reaps it
        if not alive(grandchild):
            break
        time.sleep(0.1)
    assert not alive(grandchild)


def test_a_worker_that_finishes_or_waits_outside_a_pass_is_left_alone(tmp_path):
    assert watch(worker(tmp_path, "setting 0;pass ;wait ", then_s=1.5, code=3), deadline_s=0.5) == (3, None)
    assert watch(worker(tmp_path, "setting 0;pass ", then_s=0.1), deadline_s=5.0) == (0, None)


def test_a_compile_past_its_cap_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(deadline, "COMPILE_CAP_S", 0.5)
    status, hung = watch(worker(tmp_path, "compile ", then_s=60), deadline_s=300)
    assert hung is not None and hung.what == "compile" and hung.setting is None
    assert "compiling took over 0.5 s" in hung.message(300)


def test_beat_writes_where_a_watcher_asked_and_nowhere_otherwise(tmp_path, monkeypatch):
    monkeypatch.setattr(heartbeat, "_fd", None)
    monkeypatch.delenv(heartbeat.HEARTBEAT_ENV, raising=False)
    heartbeat.beat("pass")  # no watcher: nothing, and no error
    beats = tmp_path / "beats"
    beats.write_bytes(b"")
    monkeypatch.setattr(heartbeat, "_fd", None)
    monkeypatch.setenv(heartbeat.HEARTBEAT_ENV, str(beats))
    heartbeat.beat("setting", 4)
    heartbeat.beat("pass")
    assert beats.read_text() == "setting 4\npass \n"
    assert heartbeat.HEARTBEAT_ENV not in heartbeat.without_heartbeat()
    os.close(heartbeat._fd)


# A worker that hangs in setting 0 the first time it runs, and is the real worker from then on.
HANGS_ONCE = textwrap.dedent("""
    import os, sys, time
    marker, real = sys.argv[1], sys.argv[2:]
    if not os.path.exists(marker):
        open(marker, "w").close()
        fd = os.open(os.environ["CONVSWEEP_HEARTBEAT"], os.O_WRONLY | os.O_APPEND)
        os.write(fd, b'gpu {"gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-0f"}\\ncompile \\ncompiled \\nsetting 0\\npass \\n')
        time.sleep(60)
    os.execv(real[0], real)
""")


def test_a_hung_setting_is_stored_as_timeout_and_a_new_worker_finishes_the_job(tmp_path, capsys, db_url):
    job = spec(deadline_s=0.8)
    spec_file, out = tmp_path / "job.json", tmp_path / "r.json"
    spec_file.write_text(json.dumps({**job.to_dict(), "sweep": job.sweep}))
    script = tmp_path / "hangs_once.py"
    script.write_text(HANGS_ONCE)
    real = [sys.executable, "-m", "convsweep", "run-job", "--spec-file", str(spec_file), "--out", str(out), "--worker"]
    assert supervise(job, out, [sys.executable, str(script), str(tmp_path / "hung-once"), *real]) == 0
    assert "a pass ran past its 0.8 s deadline" in capsys.readouterr().out
    (measurement,) = ResultFile.from_json(read_json(out)).measurements
    assert measurement.status == "timeout" and "0.8 s deadline (`deadline_s`): killed" in measurement.error
    assert measurement.run_key == job.runs()[0].run_key and measurement.timings.total_s > 0.8
    # stored as run on the GPU the worker opened: the leaderboard lists it on that GPU model's board
    assert (measurement.environment["gpu"], measurement.environment["gpu_uuid"]) == ("NVIDIA H100 80GB HBM3", "GPU-0f")
    assert not (tmp_path / "r.partial").exists()  # the result file written, the resume store cleared
    engine = open_store(db_url)  # stored, untrusted, and `query failures` says why
    assert ingest_files(engine, [out]).errors == []
    engine.dispose()
    (row,) = json.loads(run_query(as_reader(db_url), "failures", fmt="json"))
    assert (row["status"], row["verdict"]) == ("timeout", "timeout") and "deadline" in row["error"]


def test_the_deadline_is_the_experiments_and_a_default_leaves_the_job_key_alone():
    from convsweep.sweep.config import DEADLINE_S

    assert spec().deadline_s == DEADLINE_S and "deadline_s" not in spec().to_dict()
    assert spec(deadline_s=20.0).to_dict()["deadline_s"] == 20.0 and spec(deadline_s=20.0).job_key != spec().job_key


def test_run_job_without_worker_watches_a_worker_that_writes_the_result(tmp_path):
    job = spec()
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "convsweep", "run-job", "--spec", json.dumps(job.to_dict()),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ResultFile.from_json(read_json(out)).measurements[0].status == "ok"


@pytest.mark.parametrize("status", ["timeout"])
def test_a_timeout_is_a_problem_the_sweeps_table_names(status):
    from convsweep.analysis import outcome

    assert status in outcome.STATUSES and status in outcome.PROBLEMS and status in outcome.WHAT_ORDER
