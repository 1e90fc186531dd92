"""The views every named query reads, written from the Python that owns what they hold: `latest_run` (each
setting's newest measurement, with its `verdict` and whether it is `trusted`) and `run_summary` over it (the
seeds' table shape: the cell's columns, one per axis of convsweep.base.axes, then the numbers).

A migration freezes their text (db/migrations/versions: the newest that sets RUN_SUMMARY_SQL), so that it keeps
its meaning whatever this module says later; tests/test_store_views.py checks that regenerating it here gives
that text, so a new axis or a new verdict is a new migration. At run time only the leaderboard reads it
(verdict_sql, TRUSTED): it ranks the newest run per setting and GPU model, which the views do not keep.
"""
from __future__ import annotations

from dataclasses import dataclass

from convsweep.base.axes import columns


@dataclass(frozen=True)
class Verdict:
    """What a stored run's number is worth, in one word. `when`: its SQL condition over the run's columns
    (`{r}`: the run's alias), the first verdict whose condition holds being the run's; `trusted`: the run
    counts where a number is ranked or compared (best, tuning's ranks, throughput, streams, ...)."""

    name: str
    meaning: str
    when: str
    trusted: bool = False


# In the order they are tried. `status` is the result file's (ok, suspect, incorrect, failed, timeout); a status this
# list did not know would stand as its own verdict, never trusted.
VERDICTS: tuple[Verdict, ...] = (
    Verdict("failed", "no number: the kernel did not compile, launch or finish (the error says why)",
            "{r}.status = 'failed'"),
    Verdict("timeout", "no number: a pass ran past the job's deadline and its process was killed (the GPU freed "
                       "for the next job)", "{r}.status = 'timeout'"),
    Verdict("incorrect", "its output was wrong, so its times are of the wrong work", "{r}.status = 'incorrect'"),
    Verdict("suspect", "right outputs, but the integrity checks doubt its times (its error gives the reasons: "
                       "below the physical floor, faster on a round it had seen, work outside the timer)",
            "{r}.status = 'suspect'"),
    Verdict("not-fresh", "right outputs, but some timed passes ran on inputs its kernel had seen (stored before "
                         "every pass was fresh): a memo could have served them",
            "{r}.status = 'ok' AND {r}.checked_passes IS NOT NULL "
            "AND ({r}.fresh_passes IS NULL OR {r}.fresh_passes < {r}.checked_passes)"),
    Verdict("fast-checks", "trusted, measured with `checks: fast` (no caching test vouches for it)",
            "{r}.status = 'ok' AND {r}.checks = 'fast'", trusted=True),
    Verdict("ok", "trusted: right outputs, and every timed pass that was checked ran on inputs its kernel had not "
                  "seen", "{r}.status = 'ok'", trusted=True),
)
BY_NAME: dict[str, Verdict] = {verdict.name: verdict for verdict in VERDICTS}
TRUSTED: tuple[str, ...] = tuple(verdict.name for verdict in VERDICTS if verdict.trusted)

# run_summary's columns after the cell's, in the order they were added (migrations 0001 to 0018).
SUMMARY_COLUMNS = (
    "status", "trusted", "verdict", "op_time_1_ms", "op_time_2_ms", "forward_ms", "total_s", "accuracy",
    "max_rel_err", "profiler", "prediction_agreement", "job_id", "started_at", "id AS run_id", "op_time_1_spread",
    "op_time_2_spread", "forward_spread", "note", "error", "checks", "forward_floor_ms", "compute_ms",
    "compute_floor_ms",
)


def verdict_sql(alias: str) -> str:
    """The verdict of the run `alias` as a SQL expression (a long condition one conjunct a line)."""
    indent = "\n" + " " * 18
    cases = ""
    for verdict in VERDICTS:
        when = verdict.when.format(r=alias)
        if len(when) > 80:
            when = when.replace(" AND ", indent + "     AND ")
        cases += f"{indent}WHEN {when} THEN '{verdict.name}'"
    return f"CASE{cases}{indent}ELSE {alias}.status\n             END"


def latest_run_sql() -> str:
    """CREATE VIEW latest_run: of each run_key the newest measurement (started_at, then id), every column of run,
    the conv layers' op times (run_op_time), its verdict, and trusted (1 where its verdict is a trusted one)."""
    trusted = ", ".join(f"'{name}'" for name in TRUSTED)
    return f"""
CREATE VIEW latest_run AS
SELECT judged.*, CASE WHEN judged.verdict IN ({trusted}) THEN 1 ELSE 0 END AS trusted
FROM (SELECT ranked.*, o.op_time_1_ms, o.op_time_2_ms, o.op_time_1_spread, o.op_time_2_spread,
             {verdict_sql("ranked")} AS verdict
      FROM (SELECT r.*,
                   ROW_NUMBER() OVER (PARTITION BY r.run_key
                                      ORDER BY r.started_at DESC NULLS LAST, r.id DESC) AS measurement_rank
            FROM run r) ranked
      JOIN run_op_time o ON o.run_id = ranked.id
      WHERE ranked.measurement_rank = 1) judged
"""


def run_summary_sql() -> str:
    """CREATE VIEW run_summary: one row per latest run, its experiment, variant and cell (every axis), then the
    seeds' numbers and how far to trust them."""
    others = ",\n       ".join(", ".join(f"r.{name}" for name in SUMMARY_COLUMNS[i:i + 6])
                               for i in range(0, len(SUMMARY_COLUMNS), 6))
    return f"""
CREATE VIEW run_summary AS
SELECT r.experiment, r.variant, {columns("r")},
       {others}
FROM latest_run r
"""
