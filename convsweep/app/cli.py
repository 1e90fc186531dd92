"""`convsweep`: the command line the Snakemake rules (and people) call.

Every error a user can cause, and a file the system would not read or write (a full disk), prints one
line, `convsweep: <what>`, and exits 2; a traceback only with --verbose. A reader that goes away
(`| head`) ends a command quietly.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

from .commands import add_parsers
from convsweep.base.errors import ConvsweepError

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convsweep", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    parser.add_argument("--checkout", metavar="DIR",
                        help="refuse to run unless this convsweep is the one in DIR (the Snakemake rules pass the "
                             "checkout they were planned from)")
    add_parsers(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def os_error_line(e: OSError) -> str:
    """An OSError in the CLI's words: what went wrong and on which file, e.g. `No space left on device
    (results/e/runs/x.json)`."""
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return (e.strerror or str(e)) + (f" ({where})" if where else "")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail on it a second
    time (the recipe of Python's signal documentation for a closed pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from convsweep.base.paths import check_same_checkout, require_checkout

        require_checkout()
        if args.checkout:
            check_same_checkout(args.checkout)
        args.func(args)
        try:  # inside the handlers: a full disk or a closed pipe on stdout shows here, not at exit
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            e.filename = e.filename or "standard output"  # a failed write names no file
            raise
    except ConvsweepError as e:
        if args.verbose:
            raise
        print(f"convsweep: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`convsweep query summary | head`): stop quietly, as `cat` does, with the
        # status a shell gives a process that SIGPIPE ended (128 + 13).
        _quiet_stdout()
        return 141
    except OSError as e:
        if args.verbose:
            raise
        try:
            sys.stdout.flush()
        except OSError:  # stdout cannot take what it holds either: drop it, not fail again at exit
            _quiet_stdout()
        print(f"convsweep: {os_error_line(e)}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    """The `convsweep` program: main(), then exit without the interpreter's last garbage collection
    over everything the command made (a tenth of a second of a job's or a report's end, during which
    a sweep's next step waits)."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    run()
