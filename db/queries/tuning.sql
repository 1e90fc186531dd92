-- How does every tunable setting of each conv layer and batch size compare: its op time and its rank (1 = fastest ok setting; suspect, incorrect and failed ones are listed unranked, with their error)?
-- Only trusted settings rank (latest_run.trusted); verdict says what the others' numbers are worth (not-fresh: some
-- timed passes ran on inputs its kernel had seen). A suspect setting's error is its reasons: why its time cannot be
-- trusted (faster than the physical floor, say). The other axes of its cell follow.
-- checks: "fast" where the setting was measured with `checks: fast` (no caching test).
WITH setting AS (
    SELECT r.experiment, lt.layer_index, lt.layer, lt.variant, lt.params, lt.op_time_ms,
           r.status, r.verdict, r.error, r.checks, {r.cell}, r.id AS run_id,
           CASE WHEN r.trusted = 1 AND lt.op_time_ms IS NOT NULL THEN 1 ELSE 0 END AS ranked
    FROM layer_time lt
    JOIN latest_run r ON r.id = lt.run_id
), placed AS (
    SELECT s.*,
           CASE WHEN ranked = 1
                THEN RANK() OVER (PARTITION BY experiment, layer_index, layer, batch, ranked ORDER BY op_time_ms)
           END AS place
    FROM setting s
)
SELECT experiment,
       layer,
       batch,
       variant,
       params AS tunables,
       op_time_ms AS "op time (ms)",
       place AS "rank",
       status,
       verdict,
       CASE WHEN length(error) > 80 THEN substr(error, 1, 77) || '...' ELSE error END AS error,
       CASE WHEN checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       {cell except batch},
       run_id
FROM placed
ORDER BY experiment, layer_index, batch, ranked DESC, place,
         CASE status WHEN 'ok' THEN 0 WHEN 'suspect' THEN 1 WHEN 'incorrect' THEN 2 ELSE 3 END, run_id
