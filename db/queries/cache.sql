-- How much slower is each conv layer when it finds a cold L2 (written over before it) than a warm one, per variant and batch?
-- Pairs the latest warm and cold runs of the same job (experiment, variants, tunables, batch, streams, host memory),
-- both ok. checks: "fast" where either was measured with `checks: fast` (no caching test).
SELECT w.experiment,
       lw.variant,
       w.batch,
       lw.layer,
       lw.op_time_ms AS "warm (ms)",
       CAST(ROUND(CAST(100 * lw.op_time_spread AS NUMERIC), 1) AS VARCHAR) AS "warm ±%",
       lc.op_time_ms AS "cold (ms)",
       CAST(ROUND(CAST(100 * lc.op_time_spread AS NUMERIC), 1) AS VARCHAR) AS "cold ±%",
       CASE WHEN lw.op_time_ms > 0 THEN lc.op_time_ms / lw.op_time_ms END AS "cold / warm",
       CASE WHEN w.checks = 'fast' OR c.checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       w.id AS warm_run,
       c.id AS cold_run
FROM latest_run w
JOIN latest_run c
  ON c.experiment = w.experiment AND c.network = w.network AND c.variant = w.variant AND c.batch = w.batch
 AND c.streams = w.streams AND c.host_memory = w.host_memory
 AND CAST(c.params AS TEXT) = CAST(w.params AS TEXT) AND CAST(c.variants AS TEXT) = CAST(w.variants AS TEXT)
 AND (c.chunk_images = w.chunk_images OR (c.chunk_images IS NULL AND w.chunk_images IS NULL))
JOIN layer_time lw ON lw.run_id = w.id
JOIN layer_time lc ON lc.run_id = c.id AND lc.layer = lw.layer
WHERE w.cache = 'warm' AND c.cache = 'cold' AND w.status = 'ok' AND c.status = 'ok'
ORDER BY w.experiment, lw.variant, w.batch, lw.layer_index
