"""Files written whole or not at all, the canonical JSON that names specs, builds and environments, and
cache entries that are checked when they are read."""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import hmac
import io
import json
import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .errors import ConvsweepError

if TYPE_CHECKING:
    import numpy as np


def canonical_hash(obj: Any) -> str:
    """sha256 of obj's canonical JSON (sorted keys, no whitespace): two equal values, one name."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write to a uniquely named temporary file beside `path`, then rename: readers never see half
    a file, two writers never share a temporary name, and a failed write leaves nothing behind."""
    _write_parts_atomic(path, [data.encode() if isinstance(data, str) else data])


def _write_parts_atomic(path: str | os.PathLike, parts: list) -> None:
    """write_atomic of the parts one after another (no copy of a large payload to join them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# O_EXCL: a name another writer holds is never opened; O_NOFOLLOW: nor a link planted under it.
_TEMPORARY_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
                    | getattr(os, "O_BINARY", 0))


def _create_temporary(path: Path, mode: int = 0o666) -> tuple[int, str]:
    """A new file `.name.<random>.tmp` beside `path`, open for writing: mkstemp's names and care, but
    the mode of any file the user creates (0644 under umask 022), where mkstemp's is 0600."""
    # Mode 0666 lets the kernel apply the umask (or the directory's default ACL) as it does for
    # open(): no umask to read, which os.umask does racily for the whole process and /proc/self/status
    # only on Linux, and no chmod afterwards that would override a default ACL.
    for _ in range(tempfile.TMP_MAX):
        name = os.path.join(path.parent, f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(name, _TEMPORARY_FLAGS, mode), name
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


def checked_directory(directory: str | os.PathLike, below: str | os.PathLike | None = None) -> Path:
    """`directory`, once sure that the files written into it land there (write_atomic then makes it, and
    replaces a link at a file's name instead of writing through it). Refused with one line: a link on its way
    that another user made (root's aside: a system's /home -> /usr/home), as whoever planted it chose where
    the files go. `below`: the directory (results/) that `directory` was named under from stored data: it
    must stay inside it, and each directory below it is one convsweep makes, never a link."""
    directory = Path(os.path.normpath(directory))
    made: set[Path] = set()
    if below is not None:
        below = Path(os.path.normpath(below))
        inside = Path(os.path.relpath(directory, below))
        if inside.is_absolute() or ".." in inside.parts:
            raise ConvsweepError(f"{directory} is not inside {below}, where convsweep writes what stored data names")
        made = {below.joinpath(*inside.parts[:n]) for n in range(1, len(inside.parts) + 1)}
    own = _own_uid()
    trusted = None if own is None else {own, 0}
    for step in [*reversed(directory.parents), directory]:
        if not step.is_symlink():
            continue
        owner = step.lstat().st_uid
        if step in made or (trusted is not None and owner not in trusted):
            what = "a directory convsweep makes" if step in made else f"made by another user (uid {owner})"
            raise ConvsweepError(f"{step} is a link, {what}, to {os.readlink(step)}: convsweep writes no file "
                                 "through it; remove it" + (" or give --out" if step in made else ""))
    if below is not None and not directory.resolve().is_relative_to(below.resolve()):
        raise ConvsweepError(f"{directory} leads out of {below}, to {directory.resolve()}: convsweep does not "
                             "write there")
    return directory


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Delete the temporary files a killed writer of `path` left beside it (write_atomic's names)."""
    for stale in Path(path).parent.glob(f".{glob.escape(Path(path).name)}.*.tmp"):
        stale.unlink(missing_ok=True)


# A cache entry is one file: this line with the entry's HMAC, a line of JSON (the entry's name, the key
# that hashes what it was made from, its record, its payload's size and digest) padded with spaces so
# that the payload, which follows, starts 64-byte aligned (an array is read in place).
_SEAL_MAGIC = b"CONVSWEEP-SEALED 1 "
_SEAL_ALIGN = 64
SEAL_KEY_NAME = "seal-key"  # the per-user secret of a cache directory, mode 0600
_SEAL_KEY_BYTES = 32
_DIGEST_PIECE = 8 << 20
# O_NOFOLLOW: a symbolic link is never read through; O_NONBLOCK: a FIFO planted there never blocks the open.
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def payload_digest(data) -> str:
    """sha256 over the payload's length and the sha256 of each 8 MiB piece of it, the pieces hashed on
    the process's cores (hashlib lets go of the GIL): a 150 MB array is checked in a part of one sha256's time."""
    view = memoryview(data).cast("B")
    pieces = [view[i : i + _DIGEST_PIECE] for i in range(0, len(view), _DIGEST_PIECE)] or [view]
    workers = min(len(pieces), _usable_cores())
    if workers < 2:
        digests = [hashlib.sha256(piece).digest() for piece in pieces]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(lambda piece: hashlib.sha256(piece).digest(), pieces))
    return hashlib.sha256(len(view).to_bytes(8, "little") + b"".join(digests)).hexdigest()


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _own_uid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


class SealedCache:
    """A cache directory whose entries are checked when read, never trusted for being there.

    Each entry holds its payload and a record with the key it was made under (a hash of its inputs),
    its name, its size and digest, sealed with an HMAC under a secret of this user's kept in the
    directory (SEAL_KEY_NAME, 0600). An entry that is a symbolic link or not a plain file of this user,
    or whose seal, name, key, size or digest does not match, is removed and reads as missing, so the
    caller makes it again. The seal keeps out another user who can write the directory (they cannot
    read the secret); a process of this user can read it and forge anything."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def read(self, name: str, key: str) -> tuple[dict, memoryview] | None:
        """The record and payload of entry `name` made under `key`, or None (missing, or found bad and removed)."""
        return self._read(name, key, bytearray)

    def write(self, name: str, key: str, record: dict, payload) -> None:
        """Seal `payload` (bytes, or any contiguous buffer) and `record` (JSON) as entry `name` of `key`, atomically."""
        secret = cast(bytes, self._secret(create=True))  # made where there is none
        payload = memoryview(payload).cast("B")
        fields = {"name": name, "key": key, "record": record, "bytes": len(payload), "digest": payload_digest(payload)}
        header = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        header += b" " * (-(len(_SEAL_MAGIC) + 64 + 1 + len(header) + 1) % _SEAL_ALIGN)
        mac = hmac.new(secret, header, hashlib.sha256).hexdigest().encode()
        _write_parts_atomic(self.root / name, [_SEAL_MAGIC, mac, b"\n", header, b"\n", payload])

    def read_array(self, name: str, key: str) -> np.ndarray | None:
        """An array write_array sealed (writable, read in place: no copy), or None as `read` gives it."""
        import numpy as np

        found = self._read(name, key, lambda size: np.empty(size, np.uint8))  # no zero fill, as bytearray's
        if found is None:
            return None
        record, payload = found
        try:
            dtype = np.dtype(record["array"]["dtype"])
            if dtype.hasobject:
                raise ValueError("an object array")
            return np.frombuffer(payload, dtype).reshape(record["array"]["shape"])
        except (KeyError, TypeError, ValueError):  # sealed by this user, but not by write_array
            self.discard(name)
            return None

    def write_array(self, name: str, key: str, record: dict, array: np.ndarray) -> None:
        import numpy as np

        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:
            raise TypeError(f"{name}: an object array cannot be cached")
        self.write(name, key, {**record, "array": {"dtype": array.dtype.str, "shape": list(array.shape)}}, array)

    def discard(self, name: str) -> None:
        try:
            os.unlink(self.root / name)
        except OSError:  # gone already, or a directory: its next write fails with the reason
            pass

    def _read(self, name: str, key: str, buffer_of: Callable[[int], Any]) -> tuple[dict, memoryview] | None:
        path = self.root / name
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError:  # a symbolic link (ELOOP), or what this user may not open
            self.discard(name)
            return None
        try:
            info = os.fstat(fd)
            uid = _own_uid()
            if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
                data = None
            else:
                data, got = memoryview(buffer_of(info.st_size)).cast("B"), 0
                while got < len(data) and (n := os.readv(fd, [data[got:]])):
                    got += n
                data = data if got == len(data) else None  # cut short while it was read
        finally:
            os.close(fd)
        secret = self._secret(create=False)
        entry = _unseal(data, secret, name, key) if data is not None and secret is not None else None
        if entry is None:
            with contextlib.suppress(OSError):
                now = os.lstat(path)
                if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):  # not an entry written since
                    os.unlink(path)
        return entry

    def _secret(self, create: bool) -> bytes | None:
        """The directory's secret: a plain file of this user's that no one else may read or write; made
        (and one that is not so replaced) when `create`, which every entry sealed before it then fails."""
        path = self.root / SEAL_KEY_NAME
        found = _read_secret(path)
        if found is not None or not create:
            return found
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(_SEAL_KEY_BYTES))
            try:
                os.link(tmp, path)  # never over a secret another process has just made
            except FileExistsError:
                if (found := _read_secret(path)) is not None:
                    return found
                os.replace(tmp, path)  # one that is no secret of ours
            except OSError:  # no hard links on this file system
                os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        if (found := _read_secret(path)) is None:
            raise PermissionError(errno.EPERM, "cannot keep a secret of this user's here (0600)", str(path))
        return found


def _read_secret(path: Path) -> bytes | None:
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        uid = _own_uid()
        if (not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid)
                or info.st_mode & 0o077 or info.st_size != _SEAL_KEY_BYTES):
            return None
        data = os.read(fd, _SEAL_KEY_BYTES + 1)
    finally:
        os.close(fd)
    return data if len(data) == _SEAL_KEY_BYTES else None


def _unseal(data: memoryview, secret: bytes, name: str, key: str) -> tuple[dict, memoryview] | None:
    """The entry's record and payload where its seal, name, key, size and digest all hold; None otherwise."""
    head = bytes(data[: len(_SEAL_MAGIC) + 64 + 1])
    if not head.startswith(_SEAL_MAGIC) or not head.endswith(b"\n"):
        return None
    end = _find_newline(data, len(head))
    if end is None:
        return None
    header = bytes(data[len(head) : end])
    expected = hmac.new(secret, header, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(head[len(_SEAL_MAGIC) : -1], expected):
        return None
    payload = data[end + 1 :]
    try:
        fields = json.loads(header)
        if (fields["name"], fields["key"], fields["bytes"]) != (name, key, len(payload)):
            return None  # a sound entry of another name or key (moved, or copied over this one)
        if not hmac.compare_digest(fields["digest"], payload_digest(payload)):
            return None
        return fields["record"], payload
    except (ValueError, KeyError, TypeError):  # sealed with this user's secret, but not by SealedCache.write
        return None


def _find_newline(data: memoryview, start: int, window: int = 1 << 16, most: int = 1 << 24) -> int | None:
    """Where the first newline at or after `start` is, looking at most `most` bytes on (a record is far
    smaller), a window at a time: a large payload is never copied to be searched."""
    for offset in range(start, min(len(data), start + most), window):
        found = bytes(data[offset : offset + window]).find(b"\n")
        if found >= 0:
            return offset + found
    return None


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
