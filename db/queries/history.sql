-- Every measurement of each job, newest first: its times, the kernel code it measured (source hash, git commit, dirty tree) and the GPU it ran on (UUID, driver, clocks)?
-- status suspect: the integrity checks doubt its times (`convsweep query failures` says why; `convsweep query runs`
-- says how each latest measurement was checked).
SELECT r.experiment,
       r.job_id,
       r.started_at AS measured,
       CASE WHEN l.id IS NULL THEN '' ELSE 'latest' END AS latest,
       r.status,
       o.op_time_1_ms AS "op time 1 (ms)",
       o.op_time_2_ms AS "op time 2 (ms)",
       r.forward_ms AS "forward (ms)",
       substr(r.source_hash, 1, 12) AS source_hash,
       substr(r.git_commit, 1, 10) AS git_commit,
       CASE WHEN r.git_dirty THEN 'dirty' WHEN NOT r.git_dirty THEN 'clean' END AS tree,
       e.gpu,
       e.gpu_uuid,
       e.driver,
       r.sm_clock_mhz AS "sm MHz",
       r.memory_clock_mhz AS "mem MHz",
       r.id AS run_id
FROM run r
JOIN environment e ON e.id = r.environment_id
JOIN run_op_time o ON o.run_id = r.id
LEFT JOIN latest_run l ON l.id = r.id
ORDER BY r.experiment, r.job_id, r.started_at DESC, r.id DESC
