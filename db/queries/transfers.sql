-- How much of the copy time do streams and pinned host memory hide (ok runs)?
SELECT experiment,
       variant,
       batch,
       host_memory,
       streams,
       h2d_ms AS "h2d (ms)",
       d2h_ms AS "d2h (ms)",
       compute_ms AS "compute (ms)",
       forward_ms AS "forward (ms)",
       overlap
FROM latest_run
WHERE status = 'ok'
ORDER BY experiment, variant, batch, host_memory, streams, id
