"""One exception family, so the CLI and the jobs can print one clear line for any of them."""

import errno
import traceback
from collections.abc import Iterator
from contextlib import contextmanager


class ConvsweepError(Exception):
    """Base of every error convsweep reports to a user as one line."""


class ConfigError(ConvsweepError):
    """experiments.yaml, a network file or the variant registry says something we cannot use."""


class DataError(ConvsweepError):
    """A dataset or weights file is missing, truncated or not what its header says."""


class CompileError(ConvsweepError):
    """NVRTC rejected a kernel; the message carries the file, line and NVRTC's log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class ShapeError(ConvsweepError):
    """A variant was asked for a shape or dtype it does not support."""


class DeviceError(ConvsweepError):
    """A CUDA call failed on a GPU that opened (a launch, a copy, a module): the setting's failure.
    A GPU that cannot be opened at all is the machine's (MachineError)."""


class MachineError(ConvsweepError):
    """The machine cannot run this job (no GPU or driver, a tool the job asks for, no room to write its
    files): not a result about the code, so nothing is stored and the job fails until the machine is fixed."""


# What a write meets when the disk, not the code, is at fault: full, over quota, mounted read-only.
OUT_OF_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@contextmanager
def writing(path) -> Iterator[None]:
    """Around a write of `path`: a full, over-quota or read-only disk becomes a one-line MachineError
    naming the path; any other OSError stays as it is."""
    try:
        yield
    except OSError as e:
        if e.errno in OUT_OF_DISK:
            raise MachineError(f"cannot write {path}: {e.strerror}") from None
        raise


class StoreError(ConvsweepError):
    """The result database is unreachable, or a query was refused."""


class StoreUnavailable(StoreError):
    """The database cannot be used at all (unreachable, not a database, a schema from the future):
    no further file or job can be stored, so callers stop instead of going on."""


def failure_message(e: BaseException) -> str:
    """One line for a result or a table cell; a bug (not a ConvsweepError) also prints its
    traceback, so the job log keeps what the one line cannot."""
    if isinstance(e, ConvsweepError):
        return str(e).splitlines()[0]
    traceback.print_exc()
    return f"{type(e).__name__}: {e}".splitlines()[0]
