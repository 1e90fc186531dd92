-- Which runs are stored (the latest measurement of each job), and did each one succeed (status and error)?
-- status suspect: measured, but the integrity checks doubt its times (the reasons are its error). checks: full,
-- fast (`checks: fast`: no caching test), or empty where none ran (the CPU reference, older runs). verdict: what
-- its number is worth (convsweep/store/views.py): ok and fast-checks count; not-fresh, suspect, incorrect and
-- failed do not.
SELECT id AS run_id,
       experiment,
       job_id,
       variant,
       {cell},
       profiler,
       status,
       checks,
       verdict,
       error,
       started_at
FROM latest_run
ORDER BY experiment, variant, {cell_order}, id
