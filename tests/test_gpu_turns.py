"""The test workers' turns on the GPU (gpu_turns.py): sharers overlap, an `alone` test has it to itself
and is not starved by sharers that keep arriving."""
from __future__ import annotations

import fcntl
import os
import threading
import time

from gpu_turns import gpu_turn


def hold(directory, alone, log, name, seconds, started=None):
    with gpu_turn(directory, alone):
        log.append(("in", name, time.monotonic()))
        if started is not None:
            started.set()
        time.sleep(seconds)
        log.append(("out", name, time.monotonic()))


def wait_until_held(path, timeout=10.0):
    """Until another open file holds an exclusive flock on `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        finally:
            os.close(fd)
        time.sleep(0.01)
    raise AssertionError(f"nobody took {path}")


def spans(log):
    ins = {name: t for what, name, t in log if what == "in"}
    outs = {name: t for what, name, t in log if what == "out"}
    return {name: (ins[name], outs[name]) for name in ins}


def test_sharers_overlap(tmp_path):
    both_in = threading.Barrier(2, timeout=10)  # broken unless both hold their turn at once
    met = []

    def share():
        with gpu_turn(tmp_path, alone=False):
            both_in.wait()
            met.append(True)

    threads = [threading.Thread(target=share) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert met == [True, True]


def test_an_alone_test_waits_for_the_sharers_and_the_next_sharer_waits_for_it(tmp_path):
    log = []
    first_in = threading.Event()
    sharer = threading.Thread(target=hold, args=(tmp_path, False, log, "sharer", 0.4, first_in))
    sharer.start()
    first_in.wait()
    alone = threading.Thread(target=hold, args=(tmp_path, True, log, "alone", 0.3))
    alone.start()
    wait_until_held(tmp_path / "turnstile.lock")  # the alone test waits for the sharer, holding the turnstile
    late = threading.Thread(target=hold, args=(tmp_path, False, log, "late", 0.1))
    late.start()
    for t in (sharer, alone, late):
        t.join()
    s = spans(log)
    assert s["alone"][0] >= s["sharer"][1]  # it began after the sharer ended
    assert s["late"][0] >= s["alone"][1]  # a sharer that came while it waited did not get ahead of it
