-- How fast and how accurate is each variant at each batch size and stream count (the seeds' report table)?
SELECT variant,
       batch,
       streams,
       op_time_1_ms AS "op time 1 (ms)",
       op_time_2_ms AS "op time 2 (ms)",
       forward_ms AS "forward (ms)",
       total_s AS "total (s)",
       accuracy
FROM run_summary
WHERE status = 'ok'
ORDER BY experiment, variant, batch, streams, host_memory, run_id
