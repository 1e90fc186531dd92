"""`convsweep query`: a named query or SQL, read-only, as a table, CSV or JSON."""
from __future__ import annotations

from convsweep.app.cliargs import positive_int, positive_seconds
from .common import add_db, add_format, parse_params


def add_parser(sub) -> None:
    p = sub.add_parser("query", help="run SQL or a named query (db/queries/NAME.sql) read-only")
    p.add_argument("query", nargs="?", help="a query name or SQL text")
    add_db(p)
    add_format(p)
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="bind :NAME in the SQL")
    p.add_argument("--list", action="store_true", help="list the named queries")
    # The defaults are convsweep.analysis.query's DEFAULT_TIMEOUT_S and DEFAULT_MAX_ROWS (a test ties them), written
    # out so that building the parser does not import the database layer for every command.
    p.add_argument("--timeout", type=positive_seconds, default=5.0, metavar="SECONDS",
                   help="stop the query when it runs longer (default: %(default)s)")
    p.add_argument("--max-rows", type=positive_int, default=10_000, metavar="N",
                   help="show at most N rows, and say so when there were more (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> None:
    from convsweep.analysis.questions import named_queries, run_question

    if args.list or not args.query:
        for name, description in named_queries():
            print(f"{name:12s} {description}")
        return
    params = parse_params(args.param, typed=False)  # bound as text: the SQL casts what it compares
    print(run_question(args.db, args.query, fmt=args.format, params=params or None, timeout_s=args.timeout,
                       max_rows=args.max_rows))
