"""One exception family, so the CLI and the jobs can print one clear line for any of them."""

import traceback


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
    """No usable GPU, or a CUDA call failed."""


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
