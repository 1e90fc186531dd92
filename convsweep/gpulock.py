"""One timed job per GPU at a time, across processes: an exclusive `flock` on a file per GPU.

Snakemake's `gpu=1` resource only orders the jobs of one invocation; a second `snakemake`, or a
job left running by a killed one, would time its kernels on the same GPU at the same moment.
The kernel releases a flock when its holder exits, however it exits, so a crash never leaves
a GPU locked. The lock file names its holder, so a waiting job's log says whom it waits for.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_LOCK_DIR = Path("/tmp/convsweep-locks")


def lock_dir() -> Path:
    """$CONVSWEEP_LOCK_DIR, else /tmp/convsweep-locks: shared by every user and checkout on the host."""
    return Path(os.environ.get("CONVSWEEP_LOCK_DIR") or DEFAULT_LOCK_DIR)


def lock_path(gpu_uuid: str) -> Path:
    return lock_dir() / f"gpu-{gpu_uuid}.lock"


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
