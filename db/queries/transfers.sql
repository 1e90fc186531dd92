-- How much of the copy time do streams and pinned host memory hide (ok runs)?
-- Trusted runs (latest_run.trusted), a cell's stream counts one after another.
-- checks: "fast" where the run was measured with `checks: fast` (no caching test).
SELECT experiment,
       variant,
       {cell except streams},
       streams,
       h2d_ms AS "h2d (ms)",
       d2h_ms AS "d2h (ms)",
       compute_ms AS "compute (ms)",
       forward_ms AS "forward (ms)",
       overlap,
       CASE WHEN checks = 'fast' THEN 'fast' ELSE '' END AS checks
FROM latest_run
WHERE trusted = 1
ORDER BY experiment, variant, {cell_order except streams}, streams, id
