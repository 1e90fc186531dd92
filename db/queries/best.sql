-- Which variant and tunable setting is fastest for each conv layer and batch size (ok runs only; suspect, incorrect and failed runs never count), which others are tied with it within noise, and did a confirmation measuring them again interleaved agree?
-- standing: where a confirmation of the cell speaks (the fastest settings measured again in one process, one
-- pass of each in turn: `confirm:` in the sweep, convsweep/measure/confirm.py), "confirmed" for its winner and "tied" for
-- each a paired test could not tell from it; p is that test's, and "detectable (ms)" the smallest difference
-- its rounds would have found. A cell's newest confirmation speaks while each run it measured again is its
-- setting's latest (the view latest_confirmation).
-- Elsewhere "fastest" and "tied" are the first ranking's: tied within twice the two medians' spreads added up
-- (each the median absolute deviation of its samples), so noise alone could reorder them.
-- first place: the setting's place in the first ranking; a confirmed winner that was not first overturned it.
-- The other axes of the run's cell follow the tunables.
-- ±%: how noisy the time beside it is, its samples' median absolute deviation in % of their median; text with
-- one decimal, which a table cell would otherwise pad to four significant digits.
-- checks: "fast" where the run was measured with `checks: fast` (no caching test): a winner the full checks have
-- not vouched for. Only trusted runs rank (latest_run.trusted, convsweep/store/views.py): a suspect run, however
-- fast, is never here (`convsweep query summary` shows it), nor is a run some of whose timed passes ran on inputs
-- its kernel had seen (stored before every pass was fresh: a memo could have served them). findings: what the
-- run's kernels do that a convolution needs not (a fact, not a verdict).
WITH ranked AS (
    SELECT r.experiment, lt.variant, lt.params, {r.cell}, r.checks, r.findings,
           r.id AS run_id,
           lt.layer_index, lt.layer, lt.op_time_ms, lt.op_time_spread,
           ROW_NUMBER() OVER (PARTITION BY r.experiment, lt.layer_index, r.batch
                              ORDER BY lt.op_time_ms, r.id) AS place
    FROM layer_time lt
    JOIN latest_run r ON r.id = lt.run_id
    WHERE r.trusted = 1 AND lt.op_time_ms IS NOT NULL
),
fastest AS (
    SELECT experiment, layer_index, batch, op_time_ms AS best_ms, COALESCE(op_time_spread, 0) AS best_spread
    FROM ranked
    WHERE place = 1
),
answers AS (
    SELECT r.experiment, r.layer_index, r.place AS rank_in_cell, r.place AS first_place,
           CASE WHEN r.place = 1 THEN 'fastest' ELSE 'tied' END AS standing,
           r.variant, r.params, {r.cell}, r.op_time_ms, r.op_time_spread, r.checks, r.findings,
           r.run_id, NULL AS confirmed_ms, NULL AS p, NULL AS detectable_ms
    FROM ranked r
    JOIN fastest f ON f.experiment = r.experiment AND f.layer_index = r.layer_index AND f.batch = r.batch
    WHERE (r.place = 1
           OR r.op_time_ms - f.best_ms <= 2 * (f.best_ms * f.best_spread + r.op_time_ms * COALESCE(r.op_time_spread, 0)))
      AND NOT EXISTS (SELECT 1 FROM latest_confirmation s
                      WHERE s.experiment = r.experiment AND s.layer_index = r.layer_index AND s.batch = r.batch)
    UNION ALL
    SELECT s.experiment, s.layer_index, s.place, s.first_place,
           CASE WHEN s.standing = 'winner' THEN 'confirmed' ELSE 'tied' END,
           s.variant, s.params, {r.cell}, lt.op_time_ms, lt.op_time_spread, r.checks, r.findings,
           r.id,
           s.median_ms, s.p_value, s.detectable_ms
    FROM latest_confirmation s
    JOIN run r ON r.id = s.run_id
    JOIN layer_time lt ON lt.run_id = s.run_id AND lt.layer_index = s.layer_index
    WHERE s.standing IN ('winner', 'tied')
)
SELECT experiment,
       'op time ' || CAST(layer_index + 1 AS VARCHAR) AS layer,
       batch,
       standing,
       variant,
       params AS tunables,
       {cell except batch},
       op_time_ms AS "op time (ms)",
       CAST(ROUND(CAST(100 * op_time_spread AS NUMERIC), 1) AS VARCHAR) AS "op time ±%",
       confirmed_ms AS "confirmed (ms)",
       p,
       detectable_ms AS "detectable (ms)",
       first_place AS "first place",
       CASE WHEN checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       COALESCE(findings, '') AS findings,
       run_id
FROM answers
ORDER BY experiment, layer_index, batch, rank_in_cell, run_id
