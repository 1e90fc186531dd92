"""`convsweep browse`: the result database in Datasette (the `browse` extra), read-only, with every
named query of db/queries as a canned query titled by the question it answers.

Datasette serves SQLite files only. A finished database is served immutable (no write, no lock,
nothing that could change the file); one whose write-ahead log still holds runs (a sweep storing
results right now) is opened mode=ro instead, since immutable mode reads the file without its log.
"""
from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from convsweep.errors import ConvsweepError, StoreError
from convsweep.paths import QUERIES_DIR
from convsweep.query import list_queries
from convsweep.store import resolve_url, show_url, sqlite_path

INSTALL_HINT = "pip install -e '.[browse]'"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long Datasette gets to shut down when asked before it is killed.
STOP_GRACE_S = 10.0


def database_file(db_url: str | None) -> Path:
    """The SQLite file behind a database URL (the default one when None), which must exist."""
    url = resolve_url(db_url)
    path = sqlite_path(url)
    if url.get_backend_name() != "sqlite":
        raise StoreError(f"Datasette serves SQLite files only, not {show_url(url)}: "
                         "browse a SQLite copy, or use `convsweep query`")
    if path is None:
        raise StoreError(f"cannot browse {show_url(url)}: give a SQLite file, e.g. sqlite:///db/results.sqlite")
    if not path.is_file():
        raise StoreError(f"no database at {path}: run a sweep first")
    return path


def canned_queries() -> dict[str, dict[str, str]]:
    """Datasette's canned queries: one per db/queries/*.sql, titled by its first comment line and
    described by the comment lines after it."""
    queries = {}
    for name, question in list_queries():
        sql = (QUERIES_DIR / f"{name}.sql").read_text(encoding="utf-8")
        notes = []
        for line in sql.splitlines()[1:]:
            if not line.startswith("--"):
                break
            notes.append(line[2:].strip())
        queries[name] = {"sql": sql, "title": question or name}
        if notes:
            queries[name]["description"] = " ".join(notes)
    return queries


def metadata(path: Path) -> dict:
    """Datasette's metadata for the database file: a title and the canned queries under its name."""
    return {"title": "convsweep results", "description": f"{path} (read-only)",
            "databases": {path.stem: {"queries": canned_queries()}}}


def browse_command(path: Path, metadata_path: Path, port: int = 8001, host: str = "127.0.0.1") -> list[str]:
    """The `datasette serve` command line for the database file, with its metadata at `metadata_path`."""
    wal = path.with_name(path.name + "-wal")
    opened = ["--immutable", str(path)] if not wal.is_file() or wal.stat().st_size == 0 else [str(path)]
    return [sys.executable, "-m", "datasette", "serve", *opened, "--metadata", str(metadata_path),
            "--host", host, "--port", str(port)]


def serve(db_url: str | None = None, port: int = 8001, host: str = "127.0.0.1") -> int:
    """Serve the database in Datasette until it or this process is stopped (Ctrl-C, SIGTERM, SIGHUP), which stops
    Datasette too; returns Datasette's exit status, 0 when stopped."""
    path = database_file(db_url)
    if importlib.util.find_spec("datasette") is None:
        raise ConvsweepError(f"browsing needs Datasette: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="convsweep-browse-") as tmp:
        metadata_path = Path(tmp) / "metadata.json"
        metadata_path.write_text(json.dumps(metadata(path), indent=2), encoding="utf-8")
        print(f"browsing {path} read-only at http://{host}:{port}/{path.stem} (Ctrl-C stops)", file=sys.stderr)
        return run_until_stopped(browse_command(path, metadata_path, port, host))


def run_until_stopped(command: list[str]) -> int:
    """Run `command` until it exits or this process gets a stop signal, then stop it too: a signal sent to this
    process alone (`kill PID`, a service manager) would otherwise leave the server running without its parent."""
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    # SIGTERM and SIGHUP end the wait as Ctrl-C does; SIGINT too where the shell that started this process
    # left it ignored (a command started with `&` by a script), since Python then installs no handler.
    for number in STOP_SIGNALS:
        signal.signal(number, signal.default_int_handler)
    process = None
    try:
        process = subprocess.Popen(command)
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for number in STOP_SIGNALS:  # a second Ctrl-C must not cut the shutdown short and orphan the server
            signal.signal(number, signal.SIG_IGN)
        if process is not None:
            _stop(process)
        for number, handler in previous.items():
            signal.signal(number, handler)


def _stop(process: subprocess.Popen) -> None:
    """Ask the process to shut down (Datasette's server closes its connections on SIGTERM), then kill it if it
    has not within STOP_GRACE_S."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
