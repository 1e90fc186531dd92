-- Where does a job's wall time go: total seconds split into process start, data load, waiting for the GPU (another job held it), compile (or cache hit), allocation, warm-up, timed repeats, the check and the nsys profile/export?
-- Every run that ran (its verdict is not failed), with its cell.
-- checks: "fast" where the run was measured with `checks: fast` (no caching test: less time).
SELECT r.experiment,
       r.variant,
       {r.cell},
       r.profiler,
       r.total_s AS "total (s)",
       MAX(CASE WHEN p.name = 'process_start' THEN p.seconds END) AS "start",
       MAX(CASE WHEN p.name = 'load' THEN p.seconds END) AS "load",
       MAX(CASE WHEN p.name = 'gpu_wait' THEN p.seconds END) AS "GPU wait",
       MAX(CASE WHEN p.name = 'compile' THEN p.seconds END) AS "compile",
       MAX(CASE WHEN p.name = 'allocate' THEN p.seconds END) AS "allocate",
       MAX(CASE WHEN p.name = 'warmup' THEN p.seconds END) AS "warm-up",
       MAX(CASE WHEN p.name = 'timed' THEN p.seconds END) AS "timed",
       MAX(CASE WHEN p.name = 'check' THEN p.seconds END) AS "check",
       MAX(CASE WHEN p.name = 'profile' THEN p.seconds END) AS "nsys",
       CASE WHEN r.checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       r.id AS run_id
FROM latest_run r
LEFT JOIN phase p ON p.run_id = r.id
WHERE r.verdict <> 'failed'
GROUP BY r.id, r.experiment, r.variant, {r.cell}, r.profiler, r.total_s, r.checks
ORDER BY r.experiment, r.variant, {r.cell_order}, r.id
