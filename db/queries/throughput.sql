-- What GFLOP/s and GB/s does each conv layer reach (ok runs; GB/s counts only the bytes the layer must move at least)?
-- Trusted runs only (latest_run.trusted): a suspect run (a time below the physical floor, say) is left out, its
-- rates would be impossible ones, and so is one whose timed passes were not all on fresh inputs.
-- checks: "fast" where the run was measured with `checks: fast` (no caching test).
-- × floor: the op time over the layer's floor at this GPU's measured rates (convsweep/device/floors.py: its least bytes
-- at the device copy rate, or its FLOPs at the matmul rate of the unit its variant computes on, whichever is
-- longer). Empty until `convsweep bench --ceilings-only --db URL` has measured the GPU's rates.
SELECT r.experiment,
       lt.variant,
       r.params AS "tunables (per layer)",
       {r.cell},
       lt.layer,
       lt.op_time_ms AS "op time (ms)",
       CASE WHEN lt.op_time_ms > 0 THEN lt.flops / (lt.op_time_ms * 1e6) END AS "GFLOP/s",
       CASE WHEN lt.op_time_ms > 0 THEN lt.bytes / (lt.op_time_ms * 1e6) END AS "GB/s",
       CAST(ROUND(CAST(lt.op_time_ms / NULLIF(lt.floor_ms, 0) AS NUMERIC), 2) AS VARCHAR) AS "× floor",
       CASE WHEN r.checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       r.id AS run_id
FROM layer_time lt
JOIN latest_run r ON r.id = lt.run_id
WHERE r.trusted = 1
ORDER BY r.experiment, lt.layer, r.batch, lt.op_time_ms IS NULL, lt.op_time_ms, r.id
