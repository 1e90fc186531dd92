"""`convsweep browse`: the result database in Datasette, read-only."""
from __future__ import annotations

from convsweep.app.cliargs import positive_int
from .common import add_db


def add_parser(sub) -> None:
    p = sub.add_parser("browse", help="open the result database in Datasette, read-only, with the named queries",
                       description="Serves the SQLite result database in Datasette (pip install -e '.[browse]'), "
                                   "read-only, with every db/queries/*.sql as a canned query titled by the question "
                                   "it answers, until Ctrl-C. Datasette serves SQLite files only. It serves only a "
                                   "browser that opened the URL browse prints, whose token is new each run (other "
                                   "users of this machine cannot read the database through it).")
    add_db(p)
    p.add_argument("--port", type=positive_int, default=8001, help="the port to listen on (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: %(default)s, this machine only)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.app.browse import serve

    status = serve(args.db, port=args.port, host=args.host)
    if status:
        raise SystemExit(status)
