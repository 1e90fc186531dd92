-- Which variant and tunable setting is fastest for each conv layer and batch size (ok runs only; incorrect and failed runs never count)?
WITH layer_time AS (
    SELECT id AS run_id, experiment, variant, params, batch, streams, host_memory,
           'op time 1' AS layer, op_time_1_ms AS op_time_ms
    FROM latest_run
    WHERE status = 'ok' AND op_time_1_ms IS NOT NULL
    UNION ALL
    SELECT id AS run_id, experiment, variant, params, batch, streams, host_memory,
           'op time 2' AS layer, op_time_2_ms AS op_time_ms
    FROM latest_run
    WHERE status = 'ok' AND op_time_2_ms IS NOT NULL
),
ranked AS (
    SELECT layer_time.*,
           ROW_NUMBER() OVER (PARTITION BY experiment, layer, batch ORDER BY op_time_ms, run_id) AS place
    FROM layer_time
)
SELECT experiment,
       layer,
       batch,
       variant,
       params AS "tunables (per layer)",
       streams,
       host_memory,
       op_time_ms AS "op time (ms)",
       run_id
FROM ranked
WHERE place = 1
ORDER BY experiment, layer, batch
