"""One timed job per GPU at a time, across processes: an exclusive `flock` on a file per GPU.

A job takes the lock before its process opens a CUDA context and lets go after closing the GPU:
another process's context, let alone its kernels, slows the kernels being timed (measure.py). Any
number of jobs may prepare at once (start, load, compile), whether one `snakemake` started them
or several; they take turns on the GPU. The kernel releases a flock when its holder exits, however
it exits, so a crash never leaves a GPU locked. The lock file names its holder, so a waiting job's
log says whom it waits for. The lock path is public, so nothing found there is trusted: no link is
followed, nothing but a plain file is used, and no file this process did not make has its mode changed.

On a host with several GPUs, a job process takes the lock of the first free one (`bind_free_gpu`)
and binds to it through CUDA_VISIBLE_DEVICES, so jobs run at once, one per GPU, never two on one.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from convsweep.base.errors import DeviceError

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


# Every lock-file open: never through a symlink (one planted at the public path would turn our
# writes against its target), not inherited by the jobs we start, never a controlling terminal, and
# never blocked by a FIFO planted there (O_NONBLOCK changes nothing for a regular file: flock waits
# or not by LOCK_NB alone).
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK


def _open_lock_dir(directory: Path) -> int:
    """A descriptor of the lock directory, created like /tmp if missing; DeviceError for one that
    another user could swap locks in or that is not a real directory."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o1777)
        created = True
    except FileExistsError:  # ours from before, or another user's, even one made a moment ago: checked below
        created = False
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        # Refused even where root made the link: the default path is never one, and CONVSWEEP_LOCK_DIR
        # can name its target.
        if directory.is_symlink():
            raise DeviceError(f"GPU lock directory {directory} is a symbolic link: refused, locks are never "
                              "followed elsewhere; set CONVSWEEP_LOCK_DIR to a real directory") from None
        raise DeviceError(f"GPU lock directory {directory}: cannot open it ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (os.geteuid(), 0):  # its owner may remove and replace anyone's lock file
            raise DeviceError(f"GPU lock directory {directory} belongs to uid {st.st_uid}, not to you or root: "
                              "refused, its owner could swap the locks; have root create it with mode 1777 "
                              "or set CONVSWEEP_LOCK_DIR")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise DeviceError(f"GPU lock directory {directory} is writable by other users without the sticky bit "
                              f"(mode {stat.S_IMODE(st.st_mode):o}): refused, anyone could swap the locks; "
                              "chmod it 1777 or set CONVSWEEP_LOCK_DIR")
        if created:
            os.fchmod(fd, 0o1777)  # like /tmp: anyone may add a lock, only its owner remove it (umask narrowed mkdir)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_shared(path: Path) -> int:
    """Open (creating) a lock file every user of the host can lock too; DeviceError for anything at
    the path that is not a plain lock file (a symlink, a hard link, a FIFO, a directory)."""
    dir_fd = _open_lock_dir(path.parent)
    try:  # relative to the directory checked above: it cannot be swapped between its check and this open
        try:
            fd = os.open(path.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o666, dir_fd=dir_fd)
            created = True
        except FileExistsError:  # used as it is: never chmod a file this process did not make
            fd, created = _open_existing(path, dir_fd), False
        except OSError as e:
            raise DeviceError(f"GPU lock file {path}: cannot create it ({e.strerror})") from None
    finally:
        os.close(dir_fd)
    try:
        if created:
            os.fchmod(fd, 0o666)  # the umask narrowed it, and other users must be able to lock it too
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DeviceError(f"GPU lock file {path} is not a regular file: refused; remove it")
        # A second name may be someone's file hard-linked here: writing the holder line would overwrite it.
        # With one name, the file is a lock file, or one whoever put it here could have deleted anyway.
        if st.st_nlink != 1:
            raise DeviceError(f"GPU lock file {path} has {st.st_nlink} names (hard links): refused, another "
                              "may be someone's file; remove it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_existing(path: Path, dir_fd: int) -> int:
    """Open a lock file that is already there, without following a symlink."""
    try:
        try:
            return os.open(path.name, os.O_RDWR | _OPEN_FLAGS, dir_fd=dir_fd)
        except PermissionError:
            # Another user's lock file, not shared for writing: flock works on a read-only descriptor,
            # so we still take turns; only the holder line is not written (_name_holder).
            return os.open(path.name, os.O_RDONLY | _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DeviceError(f"GPU lock file {path} is a symbolic link: refused, a lock file is never followed "
                              "elsewhere; remove it") from None
        raise DeviceError(f"GPU lock file {path}: cannot open it ({e.strerror})") from None


def _name_holder(fd: int, holder: str) -> None:
    """Write the holder line that waiting jobs print, where the lock file is open for writing."""
    # Another user's lock file that we could open for writing is one they shared (made 0666); for
    # root, who can open any, _open_shared already refused links and anything but a plain file.
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}: {holder}\n".encode(), 0)


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
        _name_holder(fd, holder)
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
        _name_holder(fd, holder)
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
