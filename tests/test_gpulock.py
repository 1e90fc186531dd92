"""The per-GPU lock: a second process waits, says whom for, and gets the GPU when the holder exits
however it exits (a killed Snakemake's job still running holds it; SIGKILL releases it)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from convsweep.gpulock import gpu_lock, lock_path

UUID = "5e1c2d6a-0000-4000-8000-00000000beef"
HOLD = """
import sys, time
from convsweep.gpulock import gpu_lock
with gpu_lock(sys.argv[1], sys.argv[2]):
    print("holding", flush=True)
    time.sleep(float(sys.argv[3]))
print("released", flush=True)
"""


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVSWEEP_LOCK_DIR", str(tmp_path / "locks"))


def hold(job: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, UUID, job, str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_a_second_job_waits_and_its_log_says_for_whom(tmp_path):
    first = hold("job naive-b100 (lenet86-baseline)", 1.5)
    second = subprocess.Popen([sys.executable, "-c", HOLD, UUID, "job tiled-b100", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    out, err = second.communicate(timeout=30)
    waited = time.monotonic() - started
    first.wait(timeout=30)
    assert second.returncode == 0 and "holding" in out
    assert waited >= 1.0  # it could not start before the first let go
    waiting, got = err.strip().splitlines()
    assert waiting.startswith(f"waiting for GPU {UUID}: {lock_path(UUID)} is held by pid {first.pid}")
    assert waiting.endswith("job naive-b100 (lenet86-baseline)")
    assert got.startswith(f"got GPU {UUID} after waiting ")


def test_a_killed_holder_releases_the_gpu():
    holder = hold("job left running by a killed snakemake", 600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    started = time.monotonic()
    with gpu_lock(UUID, "next job", log=open(os.devnull, "w")):
        assert time.monotonic() - started < 5


def test_different_gpus_do_not_wait_for_each_other():
    holder = hold("job on GPU 0", 600)
    try:
        started = time.monotonic()
        with gpu_lock("another-gpu-uuid", "job on GPU 1", log=open(os.devnull, "w")):
            assert time.monotonic() - started < 1
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_file_is_shared_by_every_user(tmp_path):
    with gpu_lock(UUID, "me", log=open(os.devnull, "w")) as path:
        assert path.stat().st_mode & 0o777 == 0o666
        assert path.read_text().startswith(f"pid {os.getpid()} ")
    assert path.parent.stat().st_mode & 0o7777 == 0o1777


# -- several GPUs: a job takes a free one ----------------------------------------------------------
GPUS = ["GPU-5e1c2d6a-0000-4000-8000-0000000000a0", "GPU-5e1c2d6a-0000-4000-8000-0000000000b1"]
CLAIM = """
import sys, time
from convsweep.gpulock import claim_gpu
with claim_gpu(sys.argv[1].split(","), sys.argv[2], poll_s=0.05) as uuid:
    print(uuid, flush=True)
    time.sleep(float(sys.argv[3]))
"""


def claim(job: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLAIM, ",".join(GPUS), job, str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_jobs_take_different_free_gpus_and_the_next_waits_for_one():
    first, second = claim("job a", 2.0), None
    try:
        got_first = first.stdout.readline().strip()
        second = claim("job b", 2.0)
        got_second = second.stdout.readline().strip()
        assert {got_first, got_second} == set(GPUS)  # never two timed jobs on one GPU
        started = time.monotonic()
        third = claim("job c", 0)
        out, err = third.communicate(timeout=30)
        assert time.monotonic() - started >= 1.0 and out.strip() in GPUS  # it got one once a holder let go
        waiting, got = err.strip().splitlines()
        assert waiting.startswith("waiting for a free GPU: 5e1c2d6a-0000-4000-8000-0000000000a0 by pid")
        assert "job a" in waiting and "job b" in waiting and got.startswith("got GPU ")
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.wait(timeout=30)


def test_binding_shows_the_process_one_gpu_and_lets_go(monkeypatch):
    """A job process binds to a free GPU and holds its lock before CUDA starts, one GPU or several."""
    from convsweep.gpulock import LOCKED_ENV, bind_free_gpu, holds_lock_of

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    holder = claim("job a", 30)
    try:
        taken = holder.stdout.readline().strip()
        with bind_free_gpu("job b", GPUS) as uuid:
            free = next(g for g in GPUS if g != taken)
            assert uuid == free.removeprefix("GPU-")
            assert os.environ["CUDA_VISIBLE_DEVICES"] == free and holds_lock_of(uuid) and holds_lock_of(free)
        assert "CUDA_VISIBLE_DEVICES" not in os.environ and LOCKED_ENV not in os.environ
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with bind_free_gpu("job c", GPUS[:1]) as uuid:  # one GPU: locked and bound too, before CUDA starts
        assert uuid == GPUS[0].removeprefix("GPU-") and os.environ["CUDA_VISIBLE_DEVICES"] == GPUS[0]
        assert lock_path(uuid).read_text().startswith(f"pid {os.getpid()} ") and holds_lock_of(uuid)
        with bind_free_gpu("its nsys child", GPUS[:1]) as again:  # the job holds it already: no second wait
            assert again == uuid
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and LOCKED_ENV not in os.environ
    with bind_free_gpu("job on a host without NVML", []) as uuid:
        assert uuid is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # bound already (SLURM does it): left as it is
    with bind_free_gpu("job d", GPUS) as uuid:
        assert uuid is None and os.environ["CUDA_VISIBLE_DEVICES"] == "0" and LOCKED_ENV not in os.environ
