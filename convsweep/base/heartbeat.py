"""The worker's side of a job's deadlines (convsweep.measure.deadline watches): where it is, one line at a time, in
the file the watcher named in the environment. Nothing where no watcher named one (a job run by hand, the bench)."""
from __future__ import annotations

import os

HEARTBEAT_ENV = "CONVSWEEP_HEARTBEAT"  # the file the worker beats into
GPU_KEYS = ("gpu", "gpu_uuid", "compute_capability", "driver", "cuda_driver")  # a `gpu` beat's: environment()'s
_fd: int | None = None


def beat(what: str, setting: int | str | None = None) -> None:
    """Tell the watcher where the worker is: `compile`, `compiled`, `setting` (with its index), `pass`, or `wait`
    (nothing of a kernel's running: no limit); or `gpu` with the GPU it opened (a JSON object of one line: what a
    setting it kills is stored as run on). Said before any GPU wait it may hang in, outside any timing; a few
    microseconds (one appended line)."""
    global _fd
    if _fd is None:
        path = os.environ.get(HEARTBEAT_ENV)
        try:
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND) if path else -1
        except OSError:
            _fd = -1
    if _fd < 0:
        return
    try:
        os.write(_fd, f"{what} {'' if setting is None else setting}\n".encode())
    except OSError:  # the watcher's file is gone: the worker carries on, as one run by hand would
        _fd = -1


def without_heartbeat(env: dict | None = None) -> dict:
    """An environment for a process that must not beat for the worker (compute-sanitizer's run of a pass, which a
    per-pass deadline would cut: it has a limit of its own)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != HEARTBEAT_ENV}
