-- Do streams and host memory shorten end-to-end inference: best forward time (ms) and the share of copy time hidden under kernels, per stream count (ok runs)?
-- One row per cell but for its stream count ({cell except streams}), over its trusted runs (latest_run.trusted).
-- checks: "fast" where any run of the row was measured with `checks: fast` (no caching test).
SELECT experiment,
       variant,
       {cell except streams},
       MIN(CASE WHEN streams = 1 THEN forward_ms END) AS "forward s1",
       MIN(CASE WHEN streams = 2 THEN forward_ms END) AS "forward s2",
       MIN(CASE WHEN streams = 4 THEN forward_ms END) AS "forward s4",
       MIN(CASE WHEN streams = 8 THEN forward_ms END) AS "forward s8",
       MAX(CASE WHEN streams = 1 THEN overlap END) AS "overlap s1",
       MAX(CASE WHEN streams = 2 THEN overlap END) AS "overlap s2",
       MAX(CASE WHEN streams = 4 THEN overlap END) AS "overlap s4",
       MAX(CASE WHEN streams = 8 THEN overlap END) AS "overlap s8",
       MAX(CASE WHEN checks = 'fast' THEN 'fast' ELSE '' END) AS checks
FROM latest_run
WHERE trusted = 1
GROUP BY experiment, variant, {cell except streams}
ORDER BY experiment, variant, {cell_order except streams}
