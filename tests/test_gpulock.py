"""The per-GPU lock: a second process waits, says whom for, and gets the GPU when the holder exits
however it exits (a killed Snakemake's job still running holds it; SIGKILL releases it)."""
import fcntl
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from convsweep.base.errors import DeviceError
from convsweep.device.gpulock import claim_gpu, gpu_lock, lock_path

UUID = "5e1c2d6a-0000-4000-8000-00000000beef"
HOLD = """
import sys, time
from convsweep.device.gpulock import gpu_lock
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
    umask = os.umask(0o077)  # a private umask must not make a lock only its maker can take
    try:
        with gpu_lock(UUID, "me", log=open(os.devnull, "w")) as path:
            assert path.stat().st_mode & 0o777 == 0o666
            assert path.read_text().startswith(f"pid {os.getpid()} ")
    finally:
        os.umask(umask)
    assert path.parent.stat().st_mode & 0o7777 == 0o1777


# -- a lock that cannot be turned against anyone: the lock path is public, so anyone may plant things there --
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files another user (uid 65534) owns")
LOCKERS = {"gpu_lock": lambda: gpu_lock(UUID, "job", log=open(os.devnull, "w")),
           "claim_gpu": lambda: claim_gpu([UUID], "job", log=open(os.devnull, "w"))}


def refusal(locker) -> str:
    with pytest.raises(DeviceError) as e:
        with locker():
            pass
    message = str(e.value)
    assert len(message.splitlines()) == 1
    return message


def victim(tmp_path):
    """A file of root's that a planted link points at."""
    target = tmp_path / "victim.conf"
    target.write_text("precious\n")
    target.chmod(0o600)
    return target


@pytest.mark.parametrize("locker", LOCKERS.values(), ids=LOCKERS.keys())
@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_a_symlink_planted_at_the_lock_path_is_refused_and_its_target_left_alone(tmp_path, locker, dangling):
    target = victim(tmp_path) if not dangling else tmp_path / "not-yet"
    lock_path(UUID).parent.mkdir()
    lock_path(UUID).symlink_to(target)
    message = refusal(locker)
    assert str(lock_path(UUID)) in message and "symbolic link" in message
    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "precious\n" and stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("plant", [lambda path, target: os.link(target, path), lambda path, target: os.mkfifo(path),
                                   lambda path, target: path.mkdir()], ids=["hard link", "fifo", "directory"])
def test_anything_but_a_plain_lock_file_at_the_lock_path_is_refused(tmp_path, plant):
    target = victim(tmp_path)
    lock_path(UUID).parent.mkdir()
    plant(lock_path(UUID), target)
    message = refusal(LOCKERS["gpu_lock"])
    assert str(lock_path(UUID)) in message
    assert target.read_text() == "precious\n" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_existing_lock_file_keeps_its_mode(tmp_path):
    lock_path(UUID).parent.mkdir()
    lock_path(UUID).write_text("")
    lock_path(UUID).chmod(0o600)
    with gpu_lock(UUID, "me", log=open(os.devnull, "w")) as path:
        assert path.read_text().startswith(f"pid {os.getpid()} ")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def foreign_dir(path, mode: int, owner: int = 0):
    path.mkdir()
    os.chown(path, owner, owner)
    path.chmod(mode)


@pytest.mark.parametrize("make", [
    pytest.param(lambda d: foreign_dir(d, 0o1777, NOBODY), id="another user's", marks=as_root),
    pytest.param(lambda d: foreign_dir(d, 0o777), id="writable by all, not sticky"),
    pytest.param(lambda d: foreign_dir(d, 0o775), id="writable by its group, not sticky"),
])
def test_a_lock_directory_others_could_swap_locks_in_is_refused_as_it_is(tmp_path, make):
    directory = lock_path(UUID).parent
    make(directory)
    before = directory.stat()
    message = refusal(LOCKERS["gpu_lock"])
    assert str(directory) in message
    assert directory.stat().st_mode == before.st_mode and not any(directory.iterdir())


def test_a_symlinked_lock_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    lock_path(UUID).parent.symlink_to(real)
    message = refusal(LOCKERS["gpu_lock"])
    assert str(lock_path(UUID).parent) in message and "symbolic link" in message and not any(real.iterdir())


@as_root
def test_a_lock_directory_another_user_makes_while_we_make_ours_is_refused(tmp_path, monkeypatch):
    """No check-then-create window: whoever made the directory, it is checked after our mkdir."""
    directory, real_mkdir = lock_path(UUID).parent, os.mkdir

    def mkdir_after_them(path, mode=0o777, **kw):
        if os.fspath(path) == os.fspath(directory):  # theirs first, as nobody's mkdir would make it
            real_mkdir(directory)
            os.chown(directory, NOBODY, NOBODY)
            os.chmod(directory, 0o777)
        real_mkdir(path, mode, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir_after_them)
    assert f"belongs to uid {NOBODY}" in refusal(LOCKERS["gpu_lock"])
    assert stat.S_IMODE(directory.stat().st_mode) == 0o777  # theirs, left as it is


def as_nobody(body) -> str:
    """What `body` returns (or the error it raises) in a child process that is the user nobody."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            said = body()
        except BaseException as e:
            said = f"{type(e).__name__}: {e}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    return said


@as_root
def test_another_users_lock_is_shared_and_one_it_cannot_write_is_still_locked(monkeypatch):
    """Root's directory and lock files serve every user; a lock file another user may not write is
    locked through a read-only descriptor, and its holder line is left as it is."""
    shared = tempfile.mkdtemp(prefix="convsweep-gpulock-")  # tmp_path is root's alone: nobody cannot reach it
    try:
        os.chmod(shared, 0o755)
        monkeypatch.setenv("CONVSWEEP_LOCK_DIR", os.path.join(shared, "locks"))
        with gpu_lock(UUID, "root's job", log=open(os.devnull, "w")) as path:
            pass

        def lock_and_tell() -> str:
            with gpu_lock(UUID, "nobody's job", log=open(os.devnull, "w")):
                try:  # a second open file description of this process must wait as another process would
                    fcntl.flock(os.open(path, os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return "not held"
                except BlockingIOError:
                    return "held"

        assert as_nobody(lock_and_tell) == "held"
        assert path.read_text().startswith("pid ") and path.read_text().endswith(": nobody's job\n")
        path.write_text("pid 1 on host: root's job\n")
        path.chmod(0o644)
        assert as_nobody(lock_and_tell) == "held"
        assert path.read_text() == "pid 1 on host: root's job\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    finally:
        shutil.rmtree(shared)


# -- several GPUs: a job takes a free one ----------------------------------------------------------
GPUS = ["GPU-5e1c2d6a-0000-4000-8000-0000000000a0", "GPU-5e1c2d6a-0000-4000-8000-0000000000b1"]
CLAIM = """
import sys, time
from convsweep.device.gpulock import claim_gpu
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
    from convsweep.device.gpulock import LOCKED_ENV, bind_free_gpu, holds_lock_of

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
