-- Which GPU measured how many runs of each experiment (a sweep over several GPUs: every one should appear)?
-- ok: runs stored ok; suspect: measured, but the integrity checks doubt their times (`convsweep query failures`).
SELECT r.experiment,
       e.gpu,
       e.gpu_uuid,
       e.hostname,
       COUNT(*) AS runs,
       SUM(CASE WHEN r.status = 'ok' THEN 1 ELSE 0 END) AS ok,
       SUM(CASE WHEN r.status = 'suspect' THEN 1 ELSE 0 END) AS suspect,
       MIN(r.started_at) AS first,
       MAX(r.started_at) AS last
FROM run r
JOIN environment e ON e.id = r.environment_id
WHERE r.profiler IS NULL OR r.profiler <> 'cpu'
GROUP BY r.experiment, e.gpu, e.gpu_uuid, e.hostname
ORDER BY r.experiment, e.hostname, e.gpu_uuid
