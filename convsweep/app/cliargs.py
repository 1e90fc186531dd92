"""argparse types the command line shares (a value is checked where it is parsed, so a bad one is argparse's
one usage line, never a traceback later), and how long the process has run before the command starts."""
from __future__ import annotations

import argparse
import math
import os
import time


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def process_age() -> float | None:
    """Seconds since this process started, or None where that is unknown.

    On Linux both ends are on the boot clock: the start in clock ticks since boot (/proc/self/stat
    field 22) against /proc/uptime. psutil's create_time() adds a boot time truncated to whole
    seconds and is compared with time.time(), which put total_s up to a second too high.
    """
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22; `comm` may hold ' ' and ')'
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:
        return None
