-- Which runs are stored (the latest measurement of each job), and did each one succeed (status and error)?
-- status suspect: measured, but the integrity checks doubt its times (the reasons are its error). checks: full,
-- fast (`checks: fast`: no caching test), or empty where none ran (the CPU reference, older runs).
SELECT id AS run_id,
       experiment,
       job_id,
       variant,
       batch,
       streams,
       host_memory,
       profiler,
       status,
       checks,
       error,
       started_at
FROM latest_run
ORDER BY experiment, variant, batch, streams, host_memory, id
