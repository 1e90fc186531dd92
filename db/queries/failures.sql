-- Which runs failed, computed wrong results or cannot be trusted (suspect), and why?
-- Every latest run that is not trusted (latest_run.trusted), with its verdict (convsweep/store/views.py): failed,
-- incorrect, suspect, or not-fresh (ok, but some of its timed passes ran on inputs its kernel had seen: stored
-- before every pass was fresh).
-- A suspect run's error is each of its reasons ("; "-joined): a time below the physical floor, later sightings of
-- a round faster than its first (the caching test), device state left set, work outside the timer. failed_pass:
-- the first timed pass whose output was wrong (an incorrect run the integrity checks caught mid-timing).
-- findings: what its kernels' PTX does that a convolution needs not (module-scope writes, clock reads, L2
-- policies, device launches: convsweep/device/findings.py); a fact to look at, not a verdict.
SELECT id AS run_id,
       experiment,
       job_id,
       variant,
       {cell},
       status,
       verdict,
       max_rel_err,
       tolerance,
       failed_pass,
       error,
       findings
FROM latest_run
WHERE trusted = 0
ORDER BY experiment, verdict, variant, {cell_order}, id
