"""The test workers' turns on the GPU (gpu_turns.py): sharers overlap, an `alone` test has it to itself
and is not starved by sharers that keep arriving."""
from __future__ import annotations

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


def spans(log):
    ins = {name: t for what, name, t in log if what == "in"}
    outs = {name: t for what, name, t in log if what == "out"}
    return {name: (ins[name], outs[name]) for name in ins}


def test_sharers_overlap(tmp_path):
    log = []
    threads = [threading.Thread(target=hold, args=(tmp_path, False, log, n, 0.3)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = spans(log)["a"], spans(log)["b"]
    assert a0 < b1 and b0 < a1  # both held it at once


def test_an_alone_test_waits_for_the_sharers_and_the_next_sharer_waits_for_it(tmp_path):
    log = []
    first_in = threading.Event()
    sharer = threading.Thread(target=hold, args=(tmp_path, False, log, "sharer", 0.4, first_in))
    sharer.start()
    first_in.wait()
    alone = threading.Thread(target=hold, args=(tmp_path, True, log, "alone", 0.3))
    alone.start()
    time.sleep(0.1)  # the alone test now waits for the first sharer, holding the turnstile
    late = threading.Thread(target=hold, args=(tmp_path, False, log, "late", 0.1))
    late.start()
    for t in (sharer, alone, late):
        t.join()
    s = spans(log)
    assert s["alone"][0] >= s["sharer"][1]  # it began after the sharer ended
    assert s["late"][0] >= s["alone"][1]  # a sharer that came while it waited did not get ahead of it
