-- Which variant and tunable setting is fastest for each conv layer and batch size (ok runs only; suspect, incorrect and failed runs never count), and which others are tied with it within noise?
-- standing: fastest, or tied: its op time is within twice the two medians' spreads added up (each the
-- median absolute deviation of its samples) of the fastest one's, so noise alone could reorder them.
-- ±%: how noisy the time beside it is, its samples' median absolute deviation in % of their median; text with
-- one decimal, which a table cell would otherwise pad to four significant digits.
-- checks: "fast" where the run was measured with `checks: fast` (no fresh inputs, no caching test): a winner the
-- full checks have not vouched for. A suspect run, however fast, is never here: `convsweep query summary` shows it.
WITH ranked AS (
    SELECT r.experiment, lt.variant, lt.params, r.batch, r.streams, r.host_memory, r.checks, r.id AS run_id,
           lt.layer_index, lt.layer, lt.op_time_ms, lt.op_time_spread,
           ROW_NUMBER() OVER (PARTITION BY r.experiment, lt.layer_index, r.batch
                              ORDER BY lt.op_time_ms, r.id) AS place
    FROM layer_time lt
    JOIN latest_run r ON r.id = lt.run_id
    WHERE r.status = 'ok' AND lt.op_time_ms IS NOT NULL
),
fastest AS (
    SELECT experiment, layer_index, batch, op_time_ms AS best_ms, COALESCE(op_time_spread, 0) AS best_spread
    FROM ranked
    WHERE place = 1
)
SELECT r.experiment,
       'op time ' || CAST(r.layer_index + 1 AS VARCHAR) AS layer,
       r.batch,
       CASE WHEN r.place = 1 THEN 'fastest' ELSE 'tied' END AS standing,
       r.variant,
       r.params AS tunables,
       r.streams,
       r.host_memory,
       r.op_time_ms AS "op time (ms)",
       CAST(ROUND(CAST(100 * r.op_time_spread AS NUMERIC), 1) AS VARCHAR) AS "op time ±%",
       CASE WHEN r.checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       r.run_id
FROM ranked r
JOIN fastest f ON f.experiment = r.experiment AND f.layer_index = r.layer_index AND f.batch = r.batch
WHERE r.place = 1
   OR r.op_time_ms - f.best_ms <= 2 * (f.best_ms * f.best_spread + r.op_time_ms * COALESCE(r.op_time_spread, 0))
ORDER BY r.experiment, r.layer_index, r.batch, r.place
