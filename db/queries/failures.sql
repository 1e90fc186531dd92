-- Which runs failed or computed wrong results, and why?
SELECT id AS run_id,
       experiment,
       job_id,
       variant,
       batch,
       streams,
       status,
       max_rel_err,
       tolerance,
       error
FROM latest_run
WHERE status IN ('failed', 'incorrect')
ORDER BY experiment, status, variant, batch, streams, id
