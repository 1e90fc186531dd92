-- How much of the copy time do streams and pinned host memory hide (ok runs)?
-- checks: "fast" where the run was measured with `checks: fast` (no caching test).
SELECT experiment,
       variant,
       batch,
       host_memory,
       streams,
       h2d_ms AS "h2d (ms)",
       d2h_ms AS "d2h (ms)",
       compute_ms AS "compute (ms)",
       forward_ms AS "forward (ms)",
       overlap,
       CASE WHEN checks = 'fast' THEN 'fast' ELSE '' END AS checks
FROM latest_run
WHERE status = 'ok'
ORDER BY experiment, variant, batch, host_memory, streams, id
