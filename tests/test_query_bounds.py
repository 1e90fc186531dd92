"""A typed query's bounds on both backends (a deadline, a row cap that says it cut, caps in bytes that stop it with
the memory it takes bounded), a PostgreSQL backend that ends with its client, and the roles that convsweep query
refuses because they can step out of read-only."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from convsweep.base.errors import StoreError
from convsweep.analysis.query import (DEFAULT_MAX_BYTES, DEFAULT_MAX_CELL_BYTES, DEFAULT_MAX_ROWS, fetch, fetch_dicts, render,
                             run_query)
from store_fixtures import as_reader, row_counts, with_one_result

FOREVER = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) "
NEVER_ANSWERS = FOREVER + "SELECT COUNT(*) AS n FROM t"
ENDLESS_ROWS = FOREVER + "SELECT n FROM t"


def counting(up_to: int, columns: str = "n") -> str:
    return f"WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < {up_to}) SELECT {columns} FROM t"


def text_of(url: str, chars: int) -> str:
    """An SQL expression for `chars` characters of text, computed by the database of `url`."""
    if make_url(url).get_backend_name() == "sqlite":
        return f"hex(zeroblob({chars // 2}))" + (" || 'x'" if chars % 2 else "")
    return f"repeat('x', {chars})"


def store_big_values(url: str, rows: int, chars: int) -> None:
    """A table `big` of `rows` rows (id, body), each body `chars` characters of text."""
    admin = create_engine(url)
    with admin.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE big (id INTEGER, body TEXT)")
        for row in range(rows):
            connection.exec_driver_sql(f"INSERT INTO big VALUES ({row}, {text_of(url, chars)})")
    admin.dispose()


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
    ({"max_bytes": 0}, r"max_bytes must be 1 or more, got 0"),
    ({"max_cell_bytes": -1}, r"max_cell_bytes must be 1 or more, got -1"),
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


# -- the caps in bytes ---------------------------------------------------------------------------

MB = 2**20
TOTAL_CAP = r"query stopped: its rows pass {size}, the cap on what a query returns, after {rows} rows " \
            r"\(select fewer rows or columns\)"
VALUE_CAP = r"query stopped: a value passes {size}, the cap on one value \(leave out its column\)"


def test_rows_past_the_byte_cap_stop_in_one_line(stored_url):
    """Rows of 100,000 characters, far under the row cap: the eleventh passes 1 MB."""
    start_s = time.monotonic()
    with pytest.raises(StoreError, match=rf"^{TOTAL_CAP.format(size='1 MB', rows=10)}$"):
        fetch(as_reader(stored_url), counting(1_000_000, f"n, {text_of(stored_url, 100_000)} AS body"), max_bytes=MB)
    assert time.monotonic() - start_s < 5  # the million rows are never made
    answer = fetch(as_reader(stored_url), counting(10, f"n, {text_of(stored_url, 100_000)} AS body"), max_bytes=MB)
    assert len(answer.rows) == 10 and {len(row[1]) for row in answer.rows} == {100_000}


def test_the_byte_cap_counts_bytes_not_characters(stored_url, capsys):
    """Ten rows of 30,000 emoji are 300,000 characters but 1.2 MB in UTF-8: past a 1 MB cap that counted characters,
    and out as JSON of \\u escapes, 3.6 MB (the audit: 60M characters within the 64 MB cap wrote 720 MB)."""
    emoji = "\N{GRINNING FACE}"
    if make_url(stored_url).get_backend_name() == "sqlite":
        body = f"replace(hex(zeroblob(15000)), '0', '{emoji}')"
    else:
        body = f"repeat('{emoji}', 30000)"
    with pytest.raises(StoreError, match=rf"^{TOTAL_CAP.format(size='1 MB', rows=8)}$"):
        fetch(as_reader(stored_url), counting(10, f"n, {body} AS body"), max_bytes=MB)
    text = run_query(as_reader(stored_url), counting(2, f"n, {body} AS body"), fmt="json", max_bytes=MB)
    assert len(text.encode()) < 2 * 30_000 * 4 + 1000 and emoji in text  # the characters themselves, no escapes


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "computed"])
def test_a_value_past_the_cell_cap_stops_in_one_line(stored_url, stored):
    chars = MB + 1
    if stored:
        store_big_values(stored_url, rows=1, chars=chars)
    sql = "SELECT id, body FROM big" if stored else f"SELECT 1 AS id, {text_of(stored_url, chars)} AS body"
    with pytest.raises(StoreError, match=rf"^{VALUE_CAP.format(size='1 MB')}$"):
        fetch(as_reader(stored_url), sql, max_cell_bytes=MB)
    at_the_cap = f"SELECT 1 AS id, {text_of(stored_url, MB)} AS body"
    assert len(fetch(as_reader(stored_url), at_the_cap, max_cell_bytes=MB).rows[0][1]) == MB


def test_the_values_of_a_wide_row_share_the_byte_cap(stored_url):
    """Fifty columns of 40,000 characters are 2 MB in one row: each value gets a fiftieth of the 1 MB cap."""
    value = text_of(stored_url, 40_000)
    wide = "SELECT " + ", ".join(f"{value} AS v{i}" for i in range(50))
    with pytest.raises(StoreError, match=r"^query stopped: a value passes 20\.5 KB, the cap on one value in a row of "
                                         r"50 columns, which share the 1 MB cap \(select fewer columns\)$"):
        fetch(as_reader(stored_url), wide, max_bytes=MB, max_cell_bytes=MB)
    narrow = "SELECT " + ", ".join(f"{value} AS v{i}" for i in range(10))
    assert [len(v) for v in fetch(as_reader(stored_url), narrow, max_bytes=MB).rows[0]] == [40_000] * 10


def test_the_byte_caps_are_64_and_8_mb_unless_told(stored_url):
    assert (DEFAULT_MAX_BYTES, DEFAULT_MAX_CELL_BYTES) == (64 * MB, 8 * MB)
    eight_mb = text_of(stored_url, 8 * MB)
    with pytest.raises(StoreError, match=rf"^{VALUE_CAP.format(size='8 MB')}$"):
        fetch(as_reader(stored_url), f"SELECT {eight_mb} || 'x' AS body")
    with pytest.raises(StoreError, match=rf"^{TOTAL_CAP.format(size='64 MB', rows=8)}$"):
        fetch(as_reader(stored_url), counting(9, f"{eight_mb} AS body"))
    assert len(fetch(as_reader(stored_url), counting(8, f"{eight_mb} AS body")).rows) == 8


def test_an_explain_is_measured_as_it_arrives(pg_url):
    """EXPLAIN (and SHOW) cannot be a subquery whose values SQL measures: a plan that spells out a 2 MB constant
    (the planner folds repeat() into one) stops all the same."""
    with pytest.raises(StoreError, match=rf"^{VALUE_CAP.format(size='1 MB')}$"):
        fetch(as_reader(pg_url), "EXPLAIN VERBOSE SELECT repeat('x', 2097152)", max_cell_bytes=MB)
    assert fetch(as_reader(pg_url), "SHOW server_version").columns == ["server_version"]


@pytest.fixture
def big_url(stored_url):
    """stored_url with four stored values of 50 MB each."""
    store_big_values(stored_url, rows=4, chars=50 * MB)
    return stored_url


# The peak as /proc has it: getrusage's ru_maxrss would count the pytest process this one was forked from.
PEAK_RSS = """
import sys
from convsweep.base.errors import StoreError
from convsweep.analysis.query import run_query
for sql in sys.argv[2:]:
    try:
        run_query(sys.argv[1], sql, fmt="csv")
        print("answered")
    except StoreError as e:
        print(e)
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def test_memory_stays_bounded_far_below_the_data(big_url):
    """`convsweep query` in a process of its own, asked for 200 MB of stored values, 800 MB of rows under the cap
    on a value, and one row of fifty 4 MB values: each stops in one line, and the process never holds more than a
    fraction of any of them (before the caps in bytes: 0.8, 2.4 and 1.4 GB)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the peak memory of a process is read from Linux's /proc")
    questions = ["SELECT id, body FROM big",
                 counting(200, f"n, {text_of(big_url, 4 * MB)} AS body"),
                 "SELECT " + ", ".join(f"{text_of(big_url, 4 * MB)} AS v{i}" for i in range(50))]
    child = subprocess.run([sys.executable, "-c", PEAK_RSS, as_reader(big_url), *questions],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    *said, peak_rss = child.stdout.splitlines()
    assert [re.fullmatch(pattern, line) is not None for line, pattern in zip(said, [
        VALUE_CAP.format(size="8 MB"),
        TOTAL_CAP.format(size="64 MB", rows=15),
        r"query stopped: a value passes 1\.28 MB, the cap on one value in a row of 50 columns, .*",
    ])] == [True] * 3, said
    assert int(peak_rss) < 200 * MB


def test_rows_under_the_caps_come_back_as_before(stored_url):
    """What the caps measure in SQL comes back untouched: every type of a stored run, names that repeat, bound
    parameters beside a literal %, a trailing semicolon, and the question's own order."""
    reader = as_reader(stored_url)
    columns, rows, truncated = fetch(reader, "SELECT * FROM run ORDER BY id")
    assert (columns, [dict(zip(columns, row)) for row in rows]) == fetch_dicts(reader, "SELECT * FROM run ORDER BY id")
    assert not truncated and len(rows) == 1
    assert fetch(reader, "SELECT 1 AS a, 'two' AS a") == (["a", "a"], [(1, "two")], False)
    assert list(fetch(reader, "SELECT '50%' AS share, :who AS who;", {"who": "me"}).rows[0]) == ["50%", "me"]
    assert [row[0] for row in fetch(reader, counting(5) + " ORDER BY n DESC").rows] == [5, 4, 3, 2, 1]
    assert fetch(reader, "EXPLAIN SELECT COUNT(*) FROM run").rows


def test_a_long_value_is_not_padded_into_every_row_of_a_table():
    """A Markdown table pads each cell to its column's widest: one 5 MB value would be copied into every row."""
    rows = [(1, "x" * 5 * MB)] + [(n, "") for n in range(2, 1001)]
    table = render(["n", "body"], rows, "table")
    lines = table.splitlines()
    assert len(table) < 6 * MB and len(lines) == 1002
    assert lines[:2] == ["| n | body |", "|---|---|"] and lines[3] == "| 2 |  |"
    assert render(["n"], [(1,), (22,)], "table").splitlines() == ["|   n |", "|-----|", "|   1 |", "|  22 |"]


# -- a PostgreSQL backend ends with its client -----------------------------------------------------


def sleeping_client(url: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """A `convsweep query` process asleep in pg_sleep on the server, and the application name its backend has."""
    name = f"convsweep_t_{uuid.uuid4().hex[:8]}"
    client_url = make_url(as_reader(url)).update_query_dict({"application_name": name})
    code = ("import sys; from convsweep.analysis.query import run_query; "
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
