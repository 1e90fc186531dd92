"""One timed job per GPU at a time, across processes: an exclusive `flock` on a file per GPU.

A job takes the lock before its process opens a CUDA context and lets go after closing the GPU:
another process's context, let alone its kernels, slows the kernels being timed (measure.py). Any
number of jobs may prepare at once (start, load, compile), whether one `snakemake` started them
or several; they take turns on the GPU. The kernel releases a flock when its holder exits, however
it exits, so a crash never leaves a GPU locked. The lock file names its holder, so a waiting job's
log says whom it waits for.

On a host with several GPUs, a job process takes the lock of the first free one (`bind_free_gpu`)
and binds to it through CUDA_VISIBLE_DEVICES, so jobs run at once, one per GPU, never two on one.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

DEFAULT_LOCK_DIR = Path("/tmp/convsweep-locks")
# Set by bind_free_gpu to the UUID whose lock this process (or its parent job) already holds.
LOCKED_ENV = "CONVSWEEP_GPU_LOCKED"


def lock_dir() -> Path:
    """$CONVSWEEP_LOCK_DIR, else /tmp/convsweep-locks: shared by every user and checkout on the host."""
    return Path(os.environ.get("CONVSWEEP_LOCK_DIR") or DEFAULT_LOCK_DIR)


def bare_uuid(gpu_uuid: str) -> str:
    """CUDA's form of a GPU UUID; NVML and CUDA_VISIBLE_DEVICES write it 'GPU-<uuid>'."""
    return gpu_uuid.removeprefix("GPU-")


def lock_path(gpu_uuid: str) -> Path:
    return lock_dir() / f"gpu-{bare_uuid(gpu_uuid)}.lock"


def holds_lock_of(gpu_uuid: str) -> bool:
    """Whether this process's job already holds the GPU's lock (bind_free_gpu took it)."""
    return os.environ.get(LOCKED_ENV) == bare_uuid(gpu_uuid)


def _open_shared(path: Path) -> int:
    """Open (creating) a lock file every user of the host can lock too."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(path.parent, 0o1777)  # like /tmp: anyone may add a lock, only its owner remove it
        except OSError:
            pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)
    except OSError:  # another user's file: it is already shared
        pass
    return fd


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode(errors="replace").strip() or "an unnamed process"
    except OSError:
        return "an unknown process"


@contextmanager
def gpu_lock(gpu_uuid: str, holder: str, log=None) -> Iterator[Path]:
    """Hold the GPU's lock for the body; wait for it, saying whom for on `log` (stderr by default)."""
    log = log or sys.stderr
    path = lock_path(gpu_uuid)
    fd = _open_shared(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for GPU {gpu_uuid}: {path} is held by {_holder(fd)}", file=log, flush=True)
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            print(f"got GPU {gpu_uuid} after waiting {time.monotonic() - started:.1f} s", file=log, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}: {holder}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


def _try_lock(gpu_uuid: str) -> int | None:
    """The locked file's descriptor, or None (and nothing left open) when another process holds it."""
    fd = _open_shared(lock_path(gpu_uuid))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def claim_gpu(gpu_uuids: list[str], holder: str, log=None, poll_s: float = 0.05) -> Iterator[str]:
    """Hold the lock of the first of `gpu_uuids` that no other process holds, and yield its UUID;
    while all are held, say whom for once on `log` and try again every `poll_s` seconds."""
    log = log or sys.stderr
    started, said = time.monotonic(), False
    while True:
        for uuid in gpu_uuids:
            fd = _try_lock(uuid)
            if fd is not None:
                break
        else:
            if not said:
                held = "; ".join(f"{bare_uuid(u)} by {_holder_of(u)}" for u in gpu_uuids)
                print(f"waiting for a free GPU: {held}", file=log, flush=True)
                said = True
            time.sleep(poll_s)
            continue
        break
    try:
        if said:
            print(f"got GPU {bare_uuid(uuid)} after waiting {time.monotonic() - started:.1f} s", file=log, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}: {holder}\n".encode(), 0)
        yield uuid
    finally:
        os.close(fd)


def _holder_of(gpu_uuid: str) -> str:
    fd = _open_shared(lock_path(gpu_uuid))
    try:
        return _holder(fd)
    finally:
        os.close(fd)


@contextmanager
def bind_free_gpu(holder: str, gpu_uuids: list[str] | None = None, log=None) -> Iterator[str | None]:
    """Before this process starts CUDA: wait for one of this host's GPUs that no other process
    holds, hold its lock for the body, and make it the process's only visible GPU (for the children
    it starts too: nsys's, ncu's). Yields its UUID; a lock this process's job already holds (its
    parent took it: LOCKED_ENV) is yielded as it is. None where NVML cannot say which GPU CUDA will
    open (no NVML, or CUDA_VISIBLE_DEVICES set by a scheduler such as SLURM): the caller then locks
    the GPU it opened."""
    if os.environ.get(LOCKED_ENV):
        yield os.environ[LOCKED_ENV]
        return
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        yield None
        return
    if gpu_uuids is None:
        from .provenance import gpu_uuids as nvml_gpu_uuids

        gpu_uuids = nvml_gpu_uuids()
    if not gpu_uuids:
        yield None
        return
    with ExitStack() as stack:
        if len(gpu_uuids) == 1:  # a blocking flock: the waiter wakes the moment the GPU is free
            uuid = gpu_uuids[0]
            stack.enter_context(gpu_lock(uuid, holder, log))
        else:
            uuid = stack.enter_context(claim_gpu(gpu_uuids, holder, log))
        os.environ["CUDA_VISIBLE_DEVICES"] = f"GPU-{bare_uuid(uuid)}"
        os.environ[LOCKED_ENV] = bare_uuid(uuid)
        try:
            yield bare_uuid(uuid)
        finally:
            del os.environ["CUDA_VISIBLE_DEVICES"], os.environ[LOCKED_ENV]
