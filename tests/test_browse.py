"""`convsweep browse`: the Datasette command and metadata, and a real Datasette on a fixture database
answering every named query as convsweep query does, refusing to write, and serving nothing to a request
without the run's token."""
from __future__ import annotations

import hashlib
import html
import http.cookiejar
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from convsweep.app import browse
from convsweep.base.errors import ConvsweepError, StoreError
from convsweep.base.fileio import canonical_hash
from convsweep.base.paths import QUERIES_DIR, ROOT
from convsweep.analysis.query import fetch, list_queries, resolve_sql
from convsweep.store import ingest_result, open_store
from store_fixtures import every_layer, make_confirmation, make_job_file, make_result, standard_results

NO_DATASETTE = f"Datasette is not installed ({browse.INSTALL_HINT})"


def fill(path: Path) -> None:
    """Every kind of run the named queries read: ok, incorrect and failed runs of two variants, a
    tuning grid and a confirmation of its winner, stream counts per host memory, and a warm/cold pair."""
    engine = open_store(f"sqlite:///{path}")
    results = standard_results()
    results.append(make_job_file([
        make_result("naive", 100, params=every_layer(BLOCK=block), op_time_ms=(0.1 * i + 0.3, 0.7),
                    status="failed" if block == 256 else "ok")
        for i, block in enumerate((32, 64, 256))]))
    for streams in (1, 4):
        for memory in ("pageable", "pinned"):
            results.append(make_result("tiled", 10000, streams=streams, host_memory=memory))
    cold = make_result("tiled", 100, op_time_ms=(0.09, 0.2))
    cold["spec"]["cache"] = "cold"
    cold["run_key"] = canonical_hash(cold["spec"])  # another setting: its own key
    results.append(cold)
    for result in results:
        ingest_result(engine, result, None)
    # A confirmation of the tuning grid's conv1 that puts its second setting ahead of its first.
    ingest_result(engine, make_confirmation(results[-6], ms=(0.45, 0.35), standings=("slower", "winner")), None)
    engine.dispose()


@pytest.fixture(scope="module")
def results_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("browse") / "results.sqlite"
    fill(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None  # the 302 itself comes back, as an HTTPError


def browser() -> urllib.request.OpenerDirector:
    """An opener that keeps cookies and follows redirects, as a browser does."""
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def get(url: str, opener: urllib.request.OpenerDirector | None = None, headers: dict[str, str] | None = None,
        data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until_answering(base: str, process: subprocess.Popen, why: Path | None = None) -> None:
    """Wait until the server answers HTTP at all (a refusal counts), failing if its process exits first."""
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            pytest.fail(f"server exited {process.returncode}: {why.read_text() if why else ''}")
        try:
            get(f"{base}/-/versions.json")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass(frozen=True)
class Served:
    base: str
    token: str
    port: int
    opener: urllib.request.OpenerDirector  # holds the cookie the token URL set

    def get(self, path: str, **kwargs) -> tuple[int, bytes]:
        return get(f"{self.base}{path}", self.opener, **kwargs)


@pytest.fixture(scope="module")
def served(results_db, tmp_path_factory):
    """`datasette serve` as browse runs it, on a free localhost port, with a browser's cookie jar that opened
    the token URL."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(NO_DATASETTE)
    token = browse.new_token()
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "datasette.log"
    with browse.server_files(results_db) as files, log.open("wb") as err:
        process = subprocess.Popen(browse.browse_command(results_db, files, port=port),
                                   env=browse.server_environment(token), stdout=subprocess.DEVNULL, stderr=err)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_answering(base, process, log)
            opener = browser()
            assert get(f"{base}/?token={token}", opener)[0] == 200
            yield Served(base, token, port, opener)
        finally:
            process.terminate()
            process.wait(timeout=30)


# -- the command and its metadata ----------------------------------------------------------------


def test_one_canned_query_per_sql_file_titled_by_its_question(results_db):
    queries = browse.metadata(results_db)["databases"]["results"]["queries"]
    assert sorted(queries) == sorted(p.stem for p in QUERIES_DIR.glob("*.sql"))
    for name, question in list_queries():
        assert queries[name]["title"] == question
        assert queries[name]["sql"] == resolve_sql(name)  # placeholders expanded
    assert "tied" in queries["best"]["description"]  # the comment lines after the question


def test_a_finished_database_is_served_immutable(results_db, tmp_path):
    command = browse.browse_command(results_db, tmp_path, port=8123, host="127.0.0.1")
    assert command[1:4] == ["-m", "datasette", "serve"]
    assert command[command.index("--immutable") + 1] == str(results_db)
    assert command[command.index("--metadata") + 1] == str(tmp_path / "metadata.json")
    assert command[command.index("--plugins-dir") + 1] == str(tmp_path / "plugins")
    assert command[-4:] == ["--host", "127.0.0.1", "--port", "8123"]


def test_a_database_being_written_is_opened_read_only_with_its_log(tmp_path):
    db = tmp_path / "results.sqlite"
    db.write_bytes(b"")
    (tmp_path / "results.sqlite-wal").write_bytes(b"\0" * 32)
    command = browse.browse_command(db, tmp_path)
    assert "--immutable" not in command and str(db) in command


def test_the_metadata_and_the_gate_lie_where_only_this_user_may_open_them(results_db):
    with browse.server_files(results_db) as files:
        assert files.stat().st_mode & 0o777 == 0o700 and files.stat().st_uid == os.getuid()
        assert (files / "plugins").stat().st_mode & 0o777 == 0o700
        assert json.loads((files / "metadata.json").read_text()) == browse.metadata(results_db)
        assert [p.name for p in (files / "plugins").iterdir()] == ["convsweep_browse_gate.py"]
    assert not files.exists()


def test_each_token_is_new_and_fit_for_a_url():
    tokens = {browse.new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", t) for t in tokens)  # 256 bits, nothing to escape


def test_postgresql_is_one_line_saying_sqlite_only():
    with pytest.raises(StoreError, match="^Datasette serves SQLite files only") as caught:
        browse.serve("postgresql://me:secret@db.example/results")
    assert "\n" not in str(caught.value) and "secret" not in str(caught.value)


def test_a_missing_database_file_is_one_line(tmp_path):
    with pytest.raises(StoreError, match="no database at .*: run a sweep first"):
        browse.serve(f"sqlite:///{tmp_path / 'none.sqlite'}")


def test_without_datasette_the_line_says_how_to_install_it(results_db, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasette" else real(name, *a))
    with pytest.raises(ConvsweepError, match=r"pip install -e '\.\[browse\]'"):
        browse.serve(f"sqlite:///{results_db}")


# -- a real Datasette ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [name for name, _ in list_queries()])
def test_every_canned_query_answers_as_convsweep_query_does(served, results_db, name):
    status, body = served.get(f"/results/{name}.json?_shape=arrays")
    assert status == 200, body[:500]
    answer = json.loads(body)
    columns, rows, _ = fetch(f"sqlite:///{results_db}", name)
    assert answer["columns"] == columns
    assert answer["rows"] == json.loads(json.dumps([list(row) for row in rows]))
    status, page = served.get(f"/results/{name}")
    assert status == 200 and dict(list_queries())[name] in html.unescape(page.decode())


def test_the_fixture_gives_most_queries_rows(results_db):
    empty = [name for name, _ in list_queries() if not fetch(f"sqlite:///{results_db}", name)[1]]
    # Only queries over data the fixture does not make (Nsight Compute's) may come back empty.
    assert set(empty) <= {"why"}, empty


def test_datasette_refuses_to_write(served, results_db):
    before = hashlib.sha256(results_db.read_bytes()).hexdigest()
    status, body = served.get("/-/databases.json")
    assert status == 200 and [(d["name"], d["is_mutable"]) for d in json.loads(body)] == [("results", False)]
    for sql in ("DELETE FROM run", "UPDATE run SET status = 'ok'", "DROP TABLE sample"):
        status, body = served.get("/results.json?" + urllib.parse.urlencode({"sql": sql}))
        assert status == 400, body[:300]
    status, body = served.get("/results/runs", data=b"")  # a POST, past the gate
    assert status >= 400 and body != browse.REFUSAL
    assert served.get("/results/runs.json?_shape=arrays")[0] == 200
    assert hashlib.sha256(results_db.read_bytes()).hexdigest() == before


# -- only the holder of the run's token is served ------------------------------------------------

# Every kind of route: pages, the JSON API, arbitrary SQL, the whole file's download, Datasette's own
# introspection and login, its static files.
ROUTES = ["/", "/results", "/results/run", "/results/run.json?_shape=arrays", "/results/best.json",
          "/results.json?sql=select+*+from+run", "/results.db", "/-/databases.json", "/-/metadata.json",
          "/-/versions.json", "/-/plugins.json", "/-/actor.json", "/-/auth-token", "/-/static/app.css"]


@pytest.mark.parametrize("route", ROUTES)
def test_without_the_token_nothing_is_served(served, route):
    status, body = get(f"{served.base}{route}")
    assert (status, body) == (403, browse.REFUSAL)
    # The browser holding the cookie gets past the gate (auth-token is Datasette's own login, refused by it).
    assert served.get(route)[0] == (403 if route == "/-/auth-token" else 200)
    assert served.get(route)[1] != browse.REFUSAL


@pytest.mark.parametrize("how", ["wrong token", "empty token", "wrong cookie", "cookie of another port"])
def test_anything_but_the_runs_token_is_refused(served, how):
    query, cookie = {
        "wrong token": ("?token=" + browse.new_token(), ""),
        "empty token": ("?token=", ""),
        "wrong cookie": ("", f"convsweep_browse_{served.port}={browse.new_token()}"),
        "cookie of another port": ("", f"convsweep_browse_{served.port + 1}={served.token}"),
    }[how]
    assert get(f"{served.base}/results/run.json{query}", headers={"Cookie": cookie}) == (403, browse.REFUSAL)


def test_the_token_url_sets_a_cookie_and_leaves_the_url(served):
    request = urllib.request.Request(f"{served.base}/results/run.json?_shape=arrays&token={served.token}&_size=2")
    with pytest.raises(urllib.error.HTTPError) as redirect:
        urllib.request.build_opener(NoRedirect).open(request, timeout=30)
    assert redirect.value.code == 302
    location, cookie = redirect.value.headers["Location"], redirect.value.headers["Set-Cookie"]
    assert location == "/results/run.json?_shape=arrays&_size=2"
    assert cookie == f"convsweep_browse_{served.port}={served.token}; Path=/; HttpOnly; SameSite=Lax"
    # A later request carrying only the cookie gets the rows, as a browser's would.
    status, body = get(f"{served.base}{location}", headers={"Cookie": cookie.split(";")[0]})
    assert status == 200 and len(json.loads(body)["rows"]) == 2


def test_datasette_without_a_token_does_not_start(results_db, tmp_path):
    """Started without browse's token in its environment, the gate stops Datasette instead of serving everyone."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(NO_DATASETTE)
    environment = {k: v for k, v in os.environ.items() if k != browse.TOKEN_ENV}
    with browse.server_files(results_db) as files:
        done = subprocess.run(browse.browse_command(results_db, files, port=free_port()), env=environment,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and f"no token in ${browse.TOKEN_ENV}" in done.stderr


# -- stopping browse stops Datasette -------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()  # state, parent, ...
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(after_name[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def port_is_free(port: int) -> bool:
    """Whether a server could listen on the port now (as servers do, past the connections closing there)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


URL_PRINTED = re.compile(r"read-only at (http://127\.0\.0\.1:\d+/results)\?token=([A-Za-z0-9_-]+) ")


def start_browse(results_db: Path, port: int, log: Path) -> subprocess.Popen:
    """`convsweep browse` on the database and port, its stderr (and Datasette's) going to `log`."""
    with log.open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "convsweep", "browse", "--db", f"sqlite:///{results_db}",
                                 "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)


def stop_all(browsing: subprocess.Popen, servers: list[int]) -> None:
    """Kill whatever a failed test left running: browse and its Datasette, found before browse dies."""
    for pid in dict.fromkeys([*children_of(browsing.pid), *servers, browsing.pid]):
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    browsing.wait()


def test_each_run_prints_its_own_token_which_no_other_process_can_read(results_db, tmp_path):
    """Two runs side by side: each URL opens its own server and not the other's, and the token is in no
    command line (/proc/PID/cmdline, which every user may read)."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(NO_DATASETTE)
    if not Path("/proc/self/cmdline").is_file():
        pytest.skip("reading command lines needs Linux's /proc")
    ports = [free_port(), free_port()]
    runs = [start_browse(results_db, port, tmp_path / f"browse-{port}.log") for port in ports]
    servers: dict[int, list[int]] = {}
    try:
        for port, run in zip(ports, runs):
            wait_until_answering(f"http://127.0.0.1:{port}", run, tmp_path / f"browse-{port}.log")
        printed = [URL_PRINTED.search((tmp_path / f"browse-{port}.log").read_text()) for port in ports]
        assert all(printed), [(tmp_path / f"browse-{port}.log").read_text() for port in ports]
        (first, first_token), (second, second_token) = (m.groups() for m in printed)
        assert first_token != second_token
        assert get(f"{first}.json?token={first_token}", browser())[0] == 200
        assert get(f"{second}.json?token={second_token}", browser())[0] == 200
        assert get(f"{second}.json?token={first_token}", browser()) == (403, browse.REFUSAL)
        servers = {run.pid: children_of(run.pid) for run in runs}
        assert all(len(children) == 1 for children in servers.values())
        for pid in [*servers, *(child for children in servers.values() for child in children)]:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert first_token.encode() not in command_line and second_token.encode() not in command_line
    finally:
        for run in runs:
            stop_all(run, servers.get(run.pid, []))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_browse_stops_datasette_too(results_db, tmp_path, stop):
    """`kill PID` reaches convsweep browse alone, not the Datasette it started: that one must not run on."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(NO_DATASETTE)
    if not Path("/proc/self/stat").is_file():
        pytest.skip("finding the Datasette process needs Linux's /proc")
    port = free_port()
    browsing = start_browse(results_db, port, tmp_path / "browse.log")
    servers: list[int] = []
    try:
        wait_until_answering(f"http://127.0.0.1:{port}", browsing, tmp_path / "browse.log")
        servers = children_of(browsing.pid)
        assert len(servers) == 1 and running(servers[0])
        browsing.send_signal(stop)
        assert browsing.wait(timeout=30) == 0
        assert not running(servers[0])
        assert port_is_free(port)
    finally:
        stop_all(browsing, servers)
