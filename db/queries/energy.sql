-- How much energy does each job's forward pass take, and at what clocks (did the GPU slow down while it was timed)?
-- The energy is the GPU's mean power (NVML's counter, between its first and last step) over the timed part, per pass
-- taken: the whole GPU's, idle gaps between passes included, so an upper bound on the pass's own. A timed part too
-- short for the counter's steps is followed by untimed passes of the same kind (the job's "energy" phase, at most
-- energy_window_s) and the power is measured over both; blank where even those could not tell it. GFLOP/J counts the conv layers' FLOPs against that energy.
-- "throttled" counts the passes after which NVML named a slowdown (power cap, thermal, power brake).
-- Trusted runs (latest_run.trusted) on the GPU, each with its cell. checks: "fast" where the run was measured with
-- `checks: fast` (no caching test).
SELECT r.experiment,
       r.variant,
       {r.cell},
       r.repeats AS passes,
       r.energy_per_pass_j AS "J/pass",
       CASE WHEN ph.seconds > 0 THEN r.energy_j / ph.seconds END AS "mean W",
       CASE WHEN r.energy_per_pass_j > 0 THEN conv.flops / (r.energy_per_pass_j * 1e9) END AS "conv GFLOP/J",
       r.sm_clock_mhz AS "sm MHz before",
       r.sm_clock_after_mhz AS "sm MHz after",
       r.memory_clock_mhz AS "mem MHz before",
       r.memory_clock_after_mhz AS "mem MHz after",
       r.throttled_passes AS throttled,
       r.throttle_reasons AS reasons,
       CASE WHEN r.checks = 'fast' THEN 'fast' ELSE '' END AS checks,
       r.id AS run_id
FROM latest_run r
LEFT JOIN phase ph ON ph.run_id = r.id AND ph.name = 'timed'
LEFT JOIN (SELECT run_id, SUM(flops) AS flops FROM layer_time GROUP BY run_id) conv ON conv.run_id = r.id
WHERE r.trusted = 1 AND r.profiler <> 'cpu'
ORDER BY r.experiment, r.variant, {r.cell_order}, r.id
