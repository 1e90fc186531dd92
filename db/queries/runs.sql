-- Which runs are stored (the latest measurement of each job), and did each one succeed (status and error)?
SELECT id AS run_id,
       experiment,
       job_id,
       variant,
       batch,
       streams,
       host_memory,
       profiler,
       status,
       error,
       started_at
FROM latest_run
ORDER BY experiment, variant, batch, streams, host_memory, id
