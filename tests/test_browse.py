"""`convsweep browse`: the Datasette command and metadata, and a real Datasette on a fixture database
answering every named query as convsweep query does, and refusing to write."""
from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from convsweep import browse
from convsweep.errors import ConvsweepError, StoreError
from convsweep.paths import QUERIES_DIR, ROOT
from convsweep.query import fetch, list_queries
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
    cold["run_key"] = hashlib.sha256(b"cold").hexdigest()
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


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def served(results_db, tmp_path_factory):
    """The base URL of `datasette serve` as browse runs it, on a free localhost port."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(NO_DATASETTE)
    metadata_path = tmp_path_factory.mktemp("meta") / "metadata.json"
    metadata_path.write_text(json.dumps(browse.metadata(results_db)), encoding="utf-8")
    port = free_port()
    process = subprocess.Popen(browse.browse_command(results_db, metadata_path, port=port),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"datasette exited {process.returncode}: {process.stderr.read().decode()}")
            try:
                if get(f"{base}/-/versions.json")[0] == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- the command and its metadata ----------------------------------------------------------------


def test_one_canned_query_per_sql_file_titled_by_its_question(results_db):
    queries = browse.metadata(results_db)["databases"]["results"]["queries"]
    assert sorted(queries) == sorted(p.stem for p in QUERIES_DIR.glob("*.sql"))
    for name, question in list_queries():
        assert queries[name]["title"] == question
        assert queries[name]["sql"] == (QUERIES_DIR / f"{name}.sql").read_text(encoding="utf-8")
    assert "tied" in queries["best"]["description"]  # the comment lines after the question


def test_a_finished_database_is_served_immutable(results_db, tmp_path):
    command = browse.browse_command(results_db, tmp_path / "m.json", port=8123, host="127.0.0.1")
    assert command[1:4] == ["-m", "datasette", "serve"]
    assert command[command.index("--immutable") + 1] == str(results_db)
    assert command[command.index("--metadata") + 1] == str(tmp_path / "m.json")
    assert command[-4:] == ["--host", "127.0.0.1", "--port", "8123"]


def test_a_database_being_written_is_opened_read_only_with_its_log(tmp_path):
    db = tmp_path / "results.sqlite"
    db.write_bytes(b"")
    (tmp_path / "results.sqlite-wal").write_bytes(b"\0" * 32)
    command = browse.browse_command(db, tmp_path / "m.json")
    assert "--immutable" not in command and str(db) in command


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
    status, body = get(f"{served}/results/{name}.json?_shape=arrays")
    assert status == 200, body[:500]
    answer = json.loads(body)
    columns, rows, _ = fetch(f"sqlite:///{results_db}", name)
    assert answer["columns"] == columns
    assert answer["rows"] == json.loads(json.dumps([list(row) for row in rows]))
    status, page = get(f"{served}/results/{name}")
    assert status == 200 and dict(list_queries())[name] in html.unescape(page.decode())


def test_the_fixture_gives_most_queries_rows(results_db):
    empty = [name for name, _ in list_queries() if not fetch(f"sqlite:///{results_db}", name)[1]]
    # Only queries over data the fixture does not make (Nsight Compute's) may come back empty.
    assert set(empty) <= {"why"}, empty


def test_datasette_refuses_to_write(served, results_db):
    before = hashlib.sha256(results_db.read_bytes()).hexdigest()
    status, body = get(f"{served}/-/databases.json")
    assert status == 200 and [(d["name"], d["is_mutable"]) for d in json.loads(body)] == [("results", False)]
    for sql in ("DELETE FROM run", "UPDATE run SET status = 'ok'", "DROP TABLE sample"):
        status, body = get(f"{served}/results.json?" + urllib.parse.urlencode({"sql": sql}))
        assert status == 400, body[:300]
    request = urllib.request.Request(f"{served}/results/runs", data=b"", method="POST")
    try:
        status = urllib.request.urlopen(request, timeout=30).status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status >= 400
    assert get(f"{served}/results/runs.json?_shape=arrays")[0] == 200
    assert hashlib.sha256(results_db.read_bytes()).hexdigest() == before


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


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_browse_stops_datasette_too(results_db, stop):
    """`kill PID` reaches convsweep browse alone, not the Datasette it started: that one must not run on."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(NO_DATASETTE)
    if not Path("/proc/self/stat").is_file():
        pytest.skip("finding the Datasette process needs Linux's /proc")
    port = free_port()
    browsing = subprocess.Popen([sys.executable, "-m", "convsweep", "browse", "--db", f"sqlite:///{results_db}",
                                 "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            if browsing.poll() is not None:
                pytest.fail(f"browse exited {browsing.returncode}: {browsing.stderr.read().decode()}")
            try:
                if get(f"http://127.0.0.1:{port}/-/versions.json")[0] == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        servers = children_of(browsing.pid)
        assert len(servers) == 1 and running(servers[0])
        browsing.send_signal(stop)
        assert browsing.wait(timeout=30) == 0
        assert not running(servers[0])
        assert port_is_free(port)
    finally:
        for pid in [browsing.pid, *servers]:  # what the old code left behind
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        browsing.wait()
