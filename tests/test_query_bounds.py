"""A typed query's bounds on both backends (a deadline, a row cap that says it cut), a PostgreSQL backend that ends
with its client, and the roles that convsweep query refuses because they can step out of read-only."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from convsweep.errors import StoreError
from convsweep.query import DEFAULT_MAX_ROWS, fetch, fetch_dicts, run_query
from store_fixtures import as_reader, row_counts, with_one_result

FOREVER = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) "
NEVER_ANSWERS = FOREVER + "SELECT COUNT(*) AS n FROM t"
ENDLESS_ROWS = FOREVER + "SELECT n FROM t"


def counting(up_to: int) -> str:
    return f"WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < {up_to}) SELECT n FROM t"


@pytest.fixture
def stored_url(db_url):
    return with_one_result(db_url)


@pytest.fixture
def pg_url(empty_pg_url):
    return with_one_result(empty_pg_url)


# -- the deadline --------------------------------------------------------------------------------


def test_a_query_past_its_deadline_stops_in_one_line(stored_url):
    start_s = time.monotonic()
    with pytest.raises(StoreError, match=r"^query stopped after 0\.5 s \(--timeout to change\)$"):
        run_query(as_reader(stored_url), NEVER_ANSWERS, timeout_s=0.5)
    assert time.monotonic() - start_s < 3


def test_the_deadline_is_five_seconds_unless_told(stored_url):
    start_s = time.monotonic()
    with pytest.raises(StoreError, match=r"^query stopped after 5 s \(--timeout to change\)$"):
        run_query(as_reader(stored_url), NEVER_ANSWERS)
    assert 4.9 < time.monotonic() - start_s < 8


def test_a_query_within_its_deadline_answers(stored_url):
    assert json.loads(run_query(as_reader(stored_url), "SELECT COUNT(*) AS runs FROM run", fmt="json",
                                timeout_s=5)) == [{"runs": 1}]


def test_the_deadline_holds_for_the_whole_query_not_each_fetch(pg_url):
    """A server-side cursor runs its query over several statements (DECLARE, FETCH): each gets only the time left.
    Here the first row takes 0.4 s and the other two 0.8 s: each fetch within 1 s, the whole not."""
    start_s = time.monotonic()
    with pytest.raises(StoreError, match=r"^query stopped after 1 s "):
        fetch(as_reader(pg_url), "SELECT pg_sleep(0.4) FROM generate_series(1, 3)", timeout_s=1)
    assert time.monotonic() - start_s < 3


@pytest.mark.parametrize("bounds, message", [
    ({"timeout_s": 0}, r"--timeout must be a number of seconds above 0, got 0"),
    ({"timeout_s": float("nan")}, r"--timeout must be a number of seconds above 0, got nan"),
    ({"max_rows": 0}, r"--max-rows must be 1 or more, got 0"),
])
def test_bounds_that_allow_nothing_are_one_line(tmp_path, bounds, message):
    with pytest.raises(StoreError, match=rf"^{message}$"):
        run_query(f"sqlite:///{tmp_path / 'none.sqlite'}", "SELECT 1", **bounds)


# -- the row cap ---------------------------------------------------------------------------------


def test_endless_rows_stop_at_the_cap(stored_url):
    start_s = time.monotonic()
    columns, rows, truncated = fetch(as_reader(stored_url), ENDLESS_ROWS, max_rows=5, timeout_s=30)
    assert (columns, [row[0] for row in rows], truncated) == (["n"], [1, 2, 3, 4, 5], True)
    assert time.monotonic() - start_s < 5


def test_postgresql_never_builds_a_result_past_the_cap(pg_url):
    """A trillion rows from a set-returning function that yields them one by one: a server-side cursor reads four."""
    start_s = time.monotonic()
    answer = fetch(as_reader(pg_url), "SELECT generate_series(1, 1000000000000) AS n", max_rows=3, timeout_s=30)
    assert [row[0] for row in answer.rows] == [1, 2, 3] and answer.truncated
    assert time.monotonic() - start_s < 5


def test_the_cap_is_ten_thousand_rows_unless_told(stored_url):
    answer = fetch(as_reader(stored_url), counting(DEFAULT_MAX_ROWS + 1))
    assert DEFAULT_MAX_ROWS == 10_000
    assert (len(answer.rows), answer.rows[-1][0], answer.truncated) == (10_000, 10_000, True)
    assert fetch(as_reader(stored_url), counting(DEFAULT_MAX_ROWS)).truncated is False


def test_a_table_says_under_it_that_it_was_cut(stored_url):
    lines = run_query(as_reader(stored_url), counting(100), max_rows=3).splitlines()
    assert lines[2:] == ["|   1 |", "|   2 |", "|   3 |", "", "first 3 rows; --max-rows to change"]
    whole = run_query(as_reader(stored_url), counting(3), max_rows=3).splitlines()
    assert whole[-1] == "|   3 |" and len(whole) == 5


def test_csv_and_json_stay_parseable_and_stderr_says_they_were_cut(stored_url, capsys):
    as_csv = run_query(as_reader(stored_url), counting(100), fmt="csv", max_rows=3)
    assert list(csv.DictReader(io.StringIO(as_csv))) == [{"n": "1"}, {"n": "2"}, {"n": "3"}]
    assert capsys.readouterr().err == "first 3 rows; --max-rows to change\n"
    as_json = run_query(as_reader(stored_url), counting(100), fmt="json", max_rows=1)
    assert json.loads(as_json) == [{"n": 1}]
    assert capsys.readouterr().err == "first 1 row; --max-rows to change\n"
    run_query(as_reader(stored_url), counting(3), fmt="json", max_rows=3)
    assert capsys.readouterr().err == ""


def test_the_projects_own_queries_read_every_row(stored_url):
    """Reports, figures and compare read through fetch_dicts: a large sweep must not be cut short."""
    columns, rows = fetch_dicts(as_reader(stored_url), counting(DEFAULT_MAX_ROWS + 5))
    assert columns == ["n"] and len(rows) == DEFAULT_MAX_ROWS + 5 and rows[-1] == {"n": DEFAULT_MAX_ROWS + 5}


# -- a PostgreSQL backend ends with its client -----------------------------------------------------


def sleeping_client(url: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """A `convsweep query` process asleep in pg_sleep on the server, and the application name its backend has."""
    name = f"convsweep_t_{uuid.uuid4().hex[:8]}"
    client_url = make_url(as_reader(url)).update_query_dict({"application_name": name})
    code = ("import sys; from convsweep.query import run_query; "
            "run_query(sys.argv[1], 'SELECT pg_sleep(1e6)', timeout_s=float(sys.argv[2]))")
    client = subprocess.Popen([sys.executable, "-c", code, client_url.render_as_string(hide_password=False),
                               str(timeout_s)], stderr=subprocess.DEVNULL)
    return client, name


def backend_state(admin, name: str) -> str | None:
    with admin.connect() as connection:
        return connection.execute(text("SELECT COALESCE(wait_event, state) FROM pg_stat_activity "
                                       "WHERE application_name = :name"), {"name": name}).scalar()


def wait_for(predicate, within_s: float) -> float:
    """Seconds until predicate() held, or fail after within_s."""
    start_s = time.monotonic()
    while not predicate():
        if time.monotonic() - start_s > within_s:
            pytest.fail(f"not within {within_s} s")
        time.sleep(0.05)
    return time.monotonic() - start_s


@pytest.mark.parametrize("stop, timeout_s, within_s", [
    # killed: the server finds its client gone (PostgreSQL 14+: within a second; before: at the deadline)
    (signal.SIGKILL, 3.0, 3.0),
    # stopped, its socket open: the statement ends at the deadline, the transaction left idle one timeout later
    (signal.SIGSTOP, 1.5, 3.0),
])
def test_the_server_backend_never_outlives_its_client(pg_url, stop, timeout_s, within_s):
    admin = create_engine(pg_url)
    client, name = sleeping_client(pg_url, timeout_s)
    try:
        wait_for(lambda: backend_state(admin, name) == "PgSleep", within_s=60)
        os.kill(client.pid, stop)
        gone_after_s = wait_for(lambda: backend_state(admin, name) is None, within_s=within_s + 2)
        assert gone_after_s < within_s + 1  # a second for this host's load
    finally:
        client.kill()
        client.wait()
        admin.dispose()


# -- roles that step out of read-only --------------------------------------------------------------


@pytest.fixture
def make_role(pg_url):
    """Makes a LOGIN role with the grants given, and drops it afterwards; returns its URL to pg_url's database."""
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    made = []

    def make(*grants: str, inherit: bool = True) -> str:
        role = f"convsweep_t_{uuid.uuid4().hex[:8]}"
        with admin.connect() as connection:
            connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN {'' if inherit else 'NOINHERIT'}")
            for granted in ("pg_read_all_data", *grants):
                connection.exec_driver_sql(f"GRANT {granted} TO {role}")
        made.append(role)
        return make_url(pg_url).set(username=role).render_as_string(hide_password=False)

    yield make
    with admin.connect() as connection:
        for role in made:
            connection.exec_driver_sql(f"DROP ROLE {role}")
    admin.dispose()


def test_a_superuser_is_refused_with_what_to_do(pg_url):
    superuser = make_url(pg_url).username
    with pytest.raises(StoreError) as caught:
        run_query(pg_url, "SELECT 1")
    assert str(caught.value) == (f"read-only connection: role {superuser} is a superuser, which can step out of a "
                                 "read-only query; connect as a plain role: CREATE ROLE reader LOGIN; "
                                 "GRANT pg_read_all_data TO reader")


@pytest.mark.parametrize("granted, inherit", [
    ("pg_read_server_files", True),
    ("pg_write_server_files", True),
    ("pg_execute_server_program", False),  # a member who must SET ROLE first is one all the same
])
def test_a_role_reaching_the_servers_files_is_refused(make_role, granted, inherit):
    url = make_role(granted, inherit=inherit)
    with pytest.raises(StoreError, match=rf"^read-only connection: role \w+ is a member of {granted}, which can "
                                         "step out of a read-only query; connect as a plain role: "):
        run_query(url, "SELECT 1")


def test_a_role_that_may_become_a_superuser_is_refused(make_role, pg_url):
    superuser = make_url(pg_url).username
    with pytest.raises(StoreError, match=rf"^read-only connection: role \w+ is a member of {superuser}, "):
        run_query(make_role(superuser), "SELECT 1")


def test_a_plain_role_cannot_take_a_superusers_role_or_files(pg_url):
    """The escape a superuser had inside one SELECT: set_config('role', ...), then the server's files."""
    reader = as_reader(pg_url)
    superuser = make_url(pg_url).username
    with pytest.raises(StoreError, match=rf'^read-only connection: permission denied to set role "{superuser}"$'):
        run_query(reader, f"SELECT set_config('role', '{superuser}', false)")
    with pytest.raises(StoreError, match=r"^read-only connection: permission denied for function pg_read_file"):
        run_query(reader, "SELECT query_to_xml('SELECT pg_read_file(''/etc/hostname'')', true, true, '')")
    who = json.loads(run_query(reader, "SELECT current_user AS who", fmt="json"))
    assert who == [{"who": make_url(reader).username}]


def test_dblink_opens_no_session_for_a_plain_role(pg_url):
    """dblink_exec runs its SQL in a session of its own, outside the read-only transaction: a plain role may open
    one only with a password it already has (dblink refuses it one that the server did not ask for)."""
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        if connection.exec_driver_sql("SELECT 1 FROM pg_available_extensions WHERE name = 'dblink'").first() is None:
            pytest.skip("the PostgreSQL server has no dblink extension")
        connection.exec_driver_sql("CREATE EXTENSION dblink")
    target = make_url(pg_url)
    dsn = f"host={target.host} port={target.port} dbname={target.database} user={target.username}"
    drop = f"SELECT dblink_exec('{dsn}', 'DROP TABLE sample CASCADE')"
    with pytest.raises(StoreError, match=r"^read-only connection: role \w+ is a superuser"):
        run_query(pg_url, drop)
    with pytest.raises(StoreError, match=r"(?i)password"):
        run_query(as_reader(pg_url), drop)
    assert row_counts(admin)["sample"] == 9
    admin.dispose()
