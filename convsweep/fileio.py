"""Files written whole or not at all, and the canonical JSON that names specs, builds and environments."""
from __future__ import annotations

import errno
import glob
import hashlib
import io
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def canonical_hash(obj: Any) -> str:
    """sha256 of obj's canonical JSON (sorted keys, no whitespace): two equal values, one name."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write to a uniquely named temporary file beside `path`, then rename: readers never see half
    a file, two writers never share a temporary name, and a failed write leaves nothing behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# O_EXCL: a name another writer holds is never opened; O_NOFOLLOW: nor a link planted under it.
_TEMPORARY_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
                    | getattr(os, "O_BINARY", 0))


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new file `.name.<random>.tmp` beside `path`, open for writing: mkstemp's names and care, but
    the mode of any file the user creates (0644 under umask 022), where mkstemp's is 0600."""
    # Mode 0666 lets the kernel apply the umask (or the directory's default ACL) as it does for
    # open(): no umask to read, which os.umask does racily for the whole process and /proc/self/status
    # only on Linux, and no chmod afterwards that would override a default ACL.
    for _ in range(tempfile.TMP_MAX):
        name = os.path.join(path.parent, f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(name, _TEMPORARY_FLAGS, 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Indented JSON, atomically; NaN is refused (JSON has none: store non-finite numbers as null)."""
    write_atomic(path, json.dumps(obj, indent=1, default=_json_default, allow_nan=False) + "\n")


def write_npy_atomic(path: str | os.PathLike, array: np.ndarray) -> None:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    write_atomic(path, buffer.getvalue())


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Delete the temporary files a killed writer of `path` left beside it (write_atomic's names)."""
    for stale in Path(path).parent.glob(f".{glob.escape(Path(path).name)}.*.tmp"):
        stale.unlink(missing_ok=True)


def json_column(value: Any) -> Any:
    """A JSON column's value: SQLite hands back its text, PostgreSQL the object."""
    return json.loads(value) if isinstance(value, str) else value


def _json_default(value: Any) -> Any:
    np = sys.modules.get("numpy")  # a process that never imported numpy holds no numpy value
    if np is not None and isinstance(value, np.generic):
        return value.item()
    if np is not None and isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")
