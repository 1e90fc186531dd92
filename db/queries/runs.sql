-- Which runs are stored, and did each one succeed (status and error of every run)?
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
FROM run
ORDER BY experiment, variant, batch, streams, host_memory, id
