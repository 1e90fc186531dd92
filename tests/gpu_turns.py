"""Turns on the one GPU for the test workers: `gpu` tests share it, `alone` tests have it to themselves.

A bare `pytest` runs over every core (conftest.py), so on a GPU machine a dozen workers launch
kernels at once. Most GPU tests only check values and do not mind. A test whose verdict rests on a
time (the red team's caching test, a side stream still running, two timings compared) can read the
other workers' kernels as its own, so it is marked `alone` and waits until no other GPU test runs.

Two `flock`s on files every worker of the session can name (the controller picks the directory;
workers inherit it through the environment): `gpu` holds `gpu.lock` shared, `alone` holds it
exclusive. A test takes its hold while holding `turnstile.lock`, so an `alone` test waiting for the
sharers to leave keeps new ones out (flock itself would let them in ahead of it, and keep it waiting).
"""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

TURNS_ENV = "CONVSWEEP_TEST_GPU_TURNS"


@contextmanager
def _flock(path: Path, operation: int) -> Iterator[None]:
    # A descriptor of its own per hold: flock conflicts between open files, even in one process.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, operation)
        yield
    finally:
        os.close(fd)  # closing the last descriptor of the open file releases its lock


@contextmanager
def gpu_turn(directory: Path, alone: bool) -> Iterator[None]:
    """Hold the GPU shared (alone=False) or exclusive (alone=True) for the body."""
    with ExitStack() as held:
        # One at a time through the turnstile: whoever waits for gpu.lock there keeps the others out.
        with _flock(directory / "turnstile.lock", fcntl.LOCK_EX):
            held.enter_context(_flock(directory / "gpu.lock", fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield
