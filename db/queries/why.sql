-- Why is each conv kernel as fast as it is: what bounds it, per variant, batch and layer (Nsight Compute, its latest profile)?
-- One profiled launch per setting, layer and kernel (the first, when a layer launches a kernel more than once).
SELECT kp.experiment,
       kp.variant,
       kp.batch,
       kp.layer,
       kp.kernel,
       kp.params AS tunables,
       kp.bound AS why,
       kp.duration_ms AS "ncu time (ms)",
       kp.sm_pct AS "SM %",
       kp.dram_pct AS "DRAM %",
       kp.achieved_occupancy_pct AS "occupancy %",
       kp.occupancy_limiter AS "occupancy limiter",
       kp.registers,
       kp.shared_bytes AS "smem/block",
       kp.l1_hit_pct AS "L1 hit %",
       kp.l2_hit_pct AS "L2 hit %",
       kp.dram_read_bytes + kp.dram_write_bytes AS "DRAM bytes",
       kp.flops AS "FLOPs (CUDA cores)"
FROM latest_kernel_profile kp
WHERE kp.launch = 0
ORDER BY kp.experiment, kp.variant, kp.batch, kp.layer, kp.kernel
