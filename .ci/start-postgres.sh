#!/usr/bin/env bash
# Start a throwaway PostgreSQL 15 on a loopback port for the store tests and print its URL as
# the last line of stdout. Everything else goes to stderr or to logs in the data directory.
# Running it again while that server is up prints the same URL (idempotent, fast).
#   start-postgres.sh status   exits 0 when the server it started is up, 1 when not (prints nothing)
#   start-postgres.sh stop     stops that server and removes its data (nothing to stop: exit 0)
# The state file under $TMPDIR (default /tmp) names the server: another TMPDIR, another server.
set -euo pipefail

mode="${1:-start}"
case "$mode" in start | status | stop) ;; *) echo "usage: start-postgres.sh [start|status|stop]" >&2; exit 2 ;; esac

db=convsweep_test
state="${TMPDIR:-/tmp}/convsweep-test-pg.state"

if ! command -v initdb >/dev/null 2>&1; then
    case "$mode" in
        start) echo "start-postgres: initdb not found; PostgreSQL tests will be skipped" >&2; exit 0 ;;
        status) exit 1 ;;
        stop) exit 0 ;;  # it could not have started one
    esac
fi
bindir="$(dirname "$(readlink -f "$(command -v initdb)")")"

# The server refuses to run as root: run its tools as the postgres OS user then.
if [ "$(id -u)" = 0 ]; then
    as_pg=(runuser -u postgres --)
else
    as_pg=()
fi

url_for() { echo "postgresql+psycopg://postgres@127.0.0.1:$1/$db"; }

ensure_db() {  # dir port
    local exists
    exists="$("${as_pg[@]}" "$bindir/psql" -h "$1" -p "$2" -U postgres -d postgres -XAtq \
        -c "SELECT 1 FROM pg_database WHERE datname = '$db'")"
    if [ "$exists" != 1 ]; then
        "${as_pg[@]}" "$bindir/createdb" -h "$1" -p "$2" -U postgres "$db" >&2
    fi
}

drop() {  # dir: a server's directory this script made, and the state naming it
    case "$1" in "${TMPDIR:-/tmp}"/convsweep-pg.*) rm -rf "$1" ;; esac
    rm -f "$state"
}

dir="" port=""
if [ -f "$state" ]; then
    read -r dir port <"$state" || true
fi
up() { [ -n "$dir" ] && [ -n "$port" ] && "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; }

case "$mode" in
    status)
        up
        exit
        ;;
    stop)
        if up && ! "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" stop -m fast -w -t 30 >/dev/null; then
            echo "start-postgres: the server of $dir/data did not stop, see $dir/log" >&2
            exit 1
        fi
        if [ -n "$dir" ]; then drop "$dir"; fi
        exit 0
        ;;
esac

if [ -n "$dir" ]; then
    if up; then
        ensure_db "$dir" "$port"
        url_for "$port"
        exit 0
    fi
    # That server is gone (reboot, killed): drop its leftovers and start afresh.
    drop "$dir"
fi

dir="$(mktemp -d "${TMPDIR:-/tmp}/convsweep-pg.XXXXXX")"
if [ ${#as_pg[@]} -gt 0 ]; then
    chown postgres: "$dir"
fi
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

if ! "${as_pg[@]}" "$bindir/initdb" -A trust -U postgres --no-sync -D "$dir/data" >"$dir/initdb.log" 2>&1; then
    echo "start-postgres: initdb failed, see $dir/initdb.log:" >&2
    tail -5 "$dir/initdb.log" >&2
    exit 1
fi
# A test server: durability is not wanted, speed is.
if ! "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null; then
    echo "start-postgres: server did not start, see $dir/log:" >&2
    tail -5 "$dir/log" >&2
    exit 1
fi
ensure_db "$dir" "$port"
echo "$dir $port" >"$state"
url_for "$port"
