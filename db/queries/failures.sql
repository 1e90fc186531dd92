-- Which runs failed, computed wrong results or cannot be trusted (suspect), and why?
-- A suspect run's error is each of its reasons ("; "-joined): a time below the physical floor, passes faster on
-- inputs they had seen, device state left set, work outside the timer. failed_pass: the first timed pass whose
-- output was wrong (an incorrect run the integrity checks caught mid-timing).
SELECT id AS run_id,
       experiment,
       job_id,
       variant,
       batch,
       streams,
       status,
       max_rel_err,
       tolerance,
       failed_pass,
       error
FROM latest_run
WHERE status IN ('failed', 'incorrect', 'suspect')
ORDER BY experiment, status, variant, batch, streams, id
