"""`convsweep browse`: the result database in Datasette (the `browse` extra), read-only, with every
named query of db/queries as a canned query titled by the question it answers.

Datasette serves SQLite files only. A finished database is served immutable (no write, no lock,
nothing that could change the file); one whose write-ahead log still holds runs (a sweep storing
results right now) is opened mode=ro instead, since immutable mode reads the file without its log.

Datasette answers whoever connects, and on 127.0.0.1 that is every user of the machine, so a database its owner
made 0600 would be read through it. A gate in front of every route (`TokenGate`, loaded as a Datasette plugin)
serves only requests that carry this run's random token: the URL browse prints has it, and opening that URL sets
a cookie that carries it on every later request.
"""
from __future__ import annotations

import hmac
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, unquote_plus

from convsweep.base.errors import ConvsweepError, StoreError
from convsweep.analysis.query import list_queries, resolve_sql
from convsweep.store import resolve_url, show_url, sqlite_path

INSTALL_HINT = "pip install -e '.[browse]'"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long Datasette gets to shut down when asked before it is killed.
STOP_GRACE_S = 10.0
# The run's token reaches Datasette in its environment, which only its owner can read (/proc/PID/environ is 0400);
# a command-line argument would be readable by every user (/proc/PID/cmdline).
TOKEN_ENV = "CONVSWEEP_BROWSE_TOKEN"
TOKEN_PARAMETER = "token"
# Datasette imports every *.py of --plugins-dir; this one's asgi_wrapper hook puts TokenGate around the whole app.
GATE_PLUGIN = """\
from datasette import hookimpl

from convsweep.app.browse import TokenGate


@hookimpl
def asgi_wrapper(datasette):
    return TokenGate.from_environment
"""
REFUSAL = (b"convsweep browse serves only the browser that opened the URL it printed when it started "
           b"(that URL's token is new each run)\n")


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
        sql = resolve_sql(name)  # its {cell} placeholders expanded, as `convsweep query` runs it
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


def new_token() -> str:
    """A token for one run of browse: 256 random bits, safe in a URL and a cookie."""
    return secrets.token_urlsafe(32)


def server_environment(token: str) -> dict[str, str]:
    """This process's environment with the run's token added, for the Datasette it starts."""
    return {**os.environ, TOKEN_ENV: token}


@contextmanager
def server_files(path: Path) -> Iterator[Path]:
    """A directory only this user may open (mode 0700, removed on exit) with Datasette's metadata.json for the
    database file and plugins/ holding the gate: nobody else may read the one or replace the other."""
    with tempfile.TemporaryDirectory(prefix="convsweep-browse-") as tmp:
        files = Path(tmp)
        (files / "metadata.json").write_text(json.dumps(metadata(path), indent=2), encoding="utf-8")
        (files / "plugins").mkdir(mode=0o700)
        (files / "plugins" / "convsweep_browse_gate.py").write_text(GATE_PLUGIN, encoding="utf-8")
        yield files


def browse_command(path: Path, files: Path, port: int = 8001, host: str = "127.0.0.1") -> list[str]:
    """The `datasette serve` command line for the database file, with the metadata and gate of `server_files`."""
    wal = path.with_name(path.name + "-wal")
    opened = ["--immutable", str(path)] if not wal.is_file() or wal.stat().st_size == 0 else [str(path)]
    return [sys.executable, "-m", "datasette", "serve", *opened, "--metadata", str(files / "metadata.json"),
            "--plugins-dir", str(files / "plugins"), "--host", host, "--port", str(port)]


def serve(db_url: str | None = None, port: int = 8001, host: str = "127.0.0.1") -> int:
    """Serve the database in Datasette, to the holder of a new token only, until it or this process is stopped
    (Ctrl-C, SIGTERM, SIGHUP), which stops Datasette too; returns Datasette's exit status, 0 when stopped."""
    path = database_file(db_url)
    if importlib.util.find_spec("datasette") is None:
        raise ConvsweepError(f"browsing needs Datasette: {INSTALL_HINT}")
    token = new_token()
    with server_files(path) as files:
        print(f"browsing {path} read-only at http://{host}:{port}/{path.stem}?{TOKEN_PARAMETER}={token} "
              "(only a browser that opens this URL is served; Ctrl-C stops)", file=sys.stderr)
        return run_until_stopped(browse_command(path, files, port, host), server_environment(token))


class TokenGate:
    """ASGI middleware around Datasette: a request is served only with the run's token, either as the `token`
    parameter of the printed URL (answered by a redirect to that URL without it, which sets the cookie) or as the
    cookie; every other request gets 403 and nothing of the database."""

    def __init__(self, app, token: str):
        if not token:
            raise ConvsweepError(f"no token in ${TOKEN_ENV}: Datasette does not serve the database to everyone")
        self.app = app
        self.token = token.encode()

    @classmethod
    def from_environment(cls, app) -> TokenGate:
        """The gate for the token browse passed in $CONVSWEEP_BROWSE_TOKEN; without one Datasette does not start."""
        return cls(app, os.environ.get(TOKEN_ENV, ""))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket (Datasette serves none) closes unanswered
            return
        # Browsers send a host's cookies to all its ports: one name per port lets two runs be open at once.
        cookie = f"convsweep_browse_{(scope.get('server') or ('', ''))[1]}"
        given, kept = _split_token(scope.get("query_string", b""))
        if given:
            if not self._is_token(given[-1]):
                await _respond(send, 403, REFUSAL)
                return
            # The token leaves the URL (history, Referer, and Datasette, which reads unknown parameters as filters).
            location = scope.get("raw_path") or quote(scope["path"]).encode()
            if kept:
                location += b"?" + "&".join(kept).encode("latin-1")
            # Lax, not Strict: a browser drops Strict cookies after a redirect that began on another site, so the
            # URL clicked in a chat or mail page would end refused; the server only reads, so Lax gives nothing away.
            await _respond(send, 302, b"", [(b"location", location), (b"set-cookie", (
                f"{cookie}={self.token.decode()}; Path=/; HttpOnly; SameSite=Lax").encode())])
            return
        if self._is_token(_cookie(scope, cookie)):
            await self.app(scope, receive, send)
            return
        await _respond(send, 403, REFUSAL)

    def _is_token(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token)


def _split_token(query_string: bytes) -> tuple[list[str], list[str]]:
    """The values of the query's token parameters, and its other parameters as sent."""
    given, kept = [], []
    for piece in filter(None, query_string.decode("latin-1").split("&")):
        name, _, value = piece.partition("=")
        if unquote_plus(name) == TOKEN_PARAMETER:
            given.append(unquote_plus(value))
        else:
            kept.append(piece)
    return given, kept


def _cookie(scope, name: str) -> str:
    """The value of the request's cookie `name`, or ''."""
    for header, value in scope.get("headers", []):
        if header == b"cookie":
            for pair in value.decode("latin-1").split(";"):
                key, _, found = pair.strip().partition("=")
                if key == name:
                    return found
    return ""


async def _respond(send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def run_until_stopped(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run `command` until it exits or this process gets a stop signal, then stop it too: a signal sent to this
    process alone (`kill PID`, a service manager) would otherwise leave the server running without its parent."""
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    # SIGTERM and SIGHUP end the wait as Ctrl-C does; SIGINT too where the shell that started this process
    # left it ignored (a command started with `&` by a script), since Python then installs no handler.
    for number in STOP_SIGNALS:
        signal.signal(number, signal.default_int_handler)
    process = None
    try:
        process = subprocess.Popen(command, env=env)
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
