-- Which variant and tunable setting is fastest for each conv layer and batch size (ok runs only; incorrect and failed runs never count), and how noisy is its op time?
-- ±%: how noisy the time beside it is, its samples' median absolute deviation in % of their median; text with
-- one decimal, which a table cell would otherwise pad to four significant digits.
WITH ranked AS (
    SELECT r.experiment, lt.variant, lt.params, r.batch, r.streams, r.host_memory, r.id AS run_id,
           lt.layer_index, lt.layer, lt.op_time_ms, lt.op_time_spread,
           ROW_NUMBER() OVER (PARTITION BY r.experiment, lt.layer_index, r.batch
                              ORDER BY lt.op_time_ms, r.id) AS place
    FROM layer_time lt
    JOIN latest_run r ON r.id = lt.run_id
    WHERE r.status = 'ok' AND lt.op_time_ms IS NOT NULL
)
SELECT experiment,
       'op time ' || CAST(layer_index + 1 AS VARCHAR) AS layer,
       batch,
       variant,
       params AS tunables,
       streams,
       host_memory,
       op_time_ms AS "op time (ms)",
       CAST(ROUND(CAST(100 * op_time_spread AS NUMERIC), 1) AS VARCHAR) AS "op time ±%",
       run_id
FROM ranked
WHERE place = 1
ORDER BY experiment, layer_index, batch
