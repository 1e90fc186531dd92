"""The views the named queries read (convsweep/store/views.py): the newest migration that writes them holds what
the generator gives today, so a new axis or verdict needs a new migration; latest_run judges every run the way
best always has; and no named query spells out the trust rules the views now carry."""
from __future__ import annotations

import copy
import importlib.util
import json
import re
from types import ModuleType

import pytest
import yaml
from sqlalchemy import inspect

from convsweep.base.axes import NAMES
from convsweep.base.paths import MIGRATIONS_DIR, QUERIES_DIR, SCHEMAS_DIR
from convsweep.store import ingest_result, migrate, open_store
from convsweep.store.views import TRUSTED, VERDICTS, latest_run_sql, run_summary_sql
from store_fixtures import INTEGRITY_FIXTURES, make_result


def migration(path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"migration_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def newest_views_migration() -> ModuleType:
    """The newest migration that writes run_summary: the text the views of a database at head were made from."""
    paths = sorted((MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"), reverse=True)
    return next(module for module in map(migration, paths) if hasattr(module, "RUN_SUMMARY_SQL"))


def test_the_newest_migration_holds_the_views_the_axes_and_verdicts_give_today():
    """Regenerated from AXES and VERDICTS, the views must read as the migration froze them: an axis or a verdict
    added since takes a new migration (copy views.latest_run_sql() and run_summary_sql() into it)."""
    newest = newest_views_migration()
    assert newest.LATEST_RUN_SQL == latest_run_sql(), f"{newest.__name__}: latest_run is not what views.py gives"
    assert newest.RUN_SUMMARY_SQL == run_summary_sql(), f"{newest.__name__}: run_summary is not what views.py gives"
    assert newest.revision >= "0019"


def test_every_status_a_result_may_have_gets_a_verdict_of_its_own():
    schema = yaml.safe_load((SCHEMAS_DIR / "result.schema.yaml").read_text(encoding="utf-8"))
    statuses = schema["$defs"]["measurement"]["properties"]["status"]["enum"]
    assert set(statuses) <= {verdict.name for verdict in VERDICTS}  # none falls through to the ELSE
    assert set(TRUSTED) == {"ok", "fast-checks"}


def integrity(**changes):
    """What the integrity checks found, as the fixture's ok naive run says it, with `changes`."""
    found = json.loads(sorted(INTEGRITY_FIXTURES.glob("naive-*.json"))[0].read_text())["measurements"][0]["integrity"]
    return {**copy.deepcopy(found), **changes}


# variant -> (its result, the verdict and trusted latest_run gives it)
JUDGED = {
    "reference": (make_result("reference", 100), "ok", 1),  # no integrity checks ran: as best always counted it
    "full": (make_result("full", 100, integrity=integrity()), "ok", 1),
    "fast": (make_result("fast", 100, integrity=integrity(checks="fast", caching=None)), "fast-checks", 1),
    "stale": (make_result("stale", 100, integrity=integrity(fresh_passes=1)), "not-fresh", 0),
    "unfresh": (make_result("unfresh", 100, integrity=integrity(fresh_passes=None)), "not-fresh", 0),
    "floor": (make_result("floor", 100, status="suspect", integrity=integrity(checks="fast", caching=None)),
              "suspect", 0),
    "wrong": (make_result("wrong", 100, status="incorrect"), "incorrect", 0),
    "broken": (make_result("broken", 100, status="failed"), "failed", 0),
}


def test_latest_run_and_run_summary_judge_every_run(db_url):
    engine = open_store(db_url)
    try:
        for result, _, _ in JUDGED.values():
            ingest_result(engine, result, None)
        with engine.connect() as connection:
            for view in ("latest_run", "run_summary"):
                judged = {variant: (verdict, trusted) for variant, verdict, trusted in connection.exec_driver_sql(
                    f"SELECT variant, verdict, trusted FROM {view}")}
                assert judged == {variant: (verdict, trusted) for variant, (_, verdict, trusted) in JUDGED.items()}
            columns = [c["name"] for c in inspect(connection).get_columns("run_summary")]
            assert columns[:2 + len(NAMES)] == ["experiment", "variant", *NAMES]
        migrate(engine, "0018", downgrade=True)  # 0018's views, as they were
        with engine.connect() as connection:
            columns = [c["name"] for c in inspect(connection).get_columns("run_summary")]
            assert not {"verdict", "trusted", "timer", "chunk_images"} & set(columns)
            assert "verdict" not in connection.exec_driver_sql("SELECT * FROM latest_run WHERE 1 = 0").keys()
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM latest_confirmation").scalar() == 0
        migrate(engine, "head")
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT COUNT(*) FROM run_summary WHERE trusted = 1").scalar() == 3
    finally:
        engine.dispose()


def without_case_expressions(sql: str) -> str:
    """The SQL outside its CASE ... END expressions (what a query shows, not which rows it keeps)."""
    kept, depth = [], 0
    for token in re.split(r"\b(CASE|END)\b", sql, flags=re.IGNORECASE):
        if token.upper() == "CASE":
            depth += 1
        elif token.upper() == "END" and depth:
            depth -= 1
        elif not depth:
            kept.append(token)
    return "".join(kept)


def test_no_named_query_spells_out_what_counts_as_trusted():
    """The rules live in the views (trusted, verdict): a query keeps or ranks rows by them, never by comparing
    status or checks itself, and never reads the fresh-input counts the rule is made of. What a query shows (a
    CASE that prints "fast", a count per status) may still read the columns it shows."""
    found = []
    for path in sorted(QUERIES_DIR.glob("*.sql")):
        sql = re.sub(r"--[^\n]*", " ", path.read_text(encoding="utf-8"))
        if re.search(r"\b(fresh_passes|checked_passes)\b", sql):
            found.append(f"{path.name}: reads the fresh-input counts")
        if match := re.search(r"\b(status|checks)\s*(=|<>|!=|\bIN\b|\bNOT\s+IN\b)", without_case_expressions(sql),
                              re.IGNORECASE):
            found.append(f"{path.name}: filters on {match.group(0).strip()} (use trusted or verdict)")
    assert not found, "\n".join(found)


def test_the_check_would_have_caught_the_queries_before_the_views_carried_the_rules():
    old_best = ("SELECT * FROM layer_time lt JOIN latest_run r ON r.id = lt.run_id WHERE r.status = 'ok' "
                "AND (r.checked_passes IS NULL OR r.fresh_passes >= r.checked_passes)")
    assert re.search(r"\bstatus\s*=", without_case_expressions(old_best))
    shown = "SELECT CASE WHEN checks = 'fast' THEN 'fast' ELSE '' END AS checks FROM latest_run WHERE trusted = 1"
    assert not re.search(r"\bchecks\s*=", without_case_expressions(shown))


@pytest.mark.parametrize("verdict", VERDICTS, ids=lambda verdict: verdict.name)
def test_each_verdict_says_what_it_means(verdict):
    assert verdict.meaning and re.fullmatch(r"[a-z]+(-[a-z]+)*", verdict.name) and "{r}." in verdict.when
