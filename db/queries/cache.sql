-- How much slower is each conv layer when it finds a cold L2 (written over before it) than a warm one, per variant and batch?
-- Pairs the latest warm and cold runs of the same setting (experiment, network, variants, tunables and every other
-- axis of the cell: {cell except cache}), both trusted (latest_run.trusted: ok, every timed pass fresh).
-- checks: "fast" where either was measured with `checks: fast` (no caching test).
SELECT r.experiment,
       lt.variant,
       {r.cell except cache},
       lt.layer,
       MAX(CASE WHEN r.cache = 'warm' THEN lt.op_time_ms END) AS "warm (ms)",
       MAX(CASE WHEN r.cache = 'warm' THEN CAST(ROUND(CAST(100 * lt.op_time_spread AS NUMERIC), 1) AS VARCHAR) END)
           AS "warm ±%",
       MAX(CASE WHEN r.cache = 'cold' THEN lt.op_time_ms END) AS "cold (ms)",
       MAX(CASE WHEN r.cache = 'cold' THEN CAST(ROUND(CAST(100 * lt.op_time_spread AS NUMERIC), 1) AS VARCHAR) END)
           AS "cold ±%",
       MAX(CASE WHEN r.cache = 'cold' THEN lt.op_time_ms END)
           / NULLIF(MAX(CASE WHEN r.cache = 'warm' THEN lt.op_time_ms END), 0) AS "cold / warm",
       MAX(CASE WHEN r.checks = 'fast' THEN 'fast' ELSE '' END) AS checks,
       MAX(CASE WHEN r.cache = 'warm' THEN r.id END) AS warm_run,
       MAX(CASE WHEN r.cache = 'cold' THEN r.id END) AS cold_run
FROM layer_time lt
JOIN latest_run r ON r.id = lt.run_id
WHERE r.trusted = 1
GROUP BY r.experiment, r.network, r.variant, CAST(r.params AS TEXT), CAST(r.variants AS TEXT), {r.cell except cache},
         lt.layer_index, lt.layer, lt.variant
HAVING COUNT(CASE WHEN r.cache = 'warm' THEN 1 END) > 0 AND COUNT(CASE WHEN r.cache = 'cold' THEN 1 END) > 0
ORDER BY r.experiment, lt.variant, {r.cell_order except cache}, lt.layer_index
