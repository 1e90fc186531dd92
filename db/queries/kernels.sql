-- What does each kernel cost: launches, median time, registers and shared memory per layer?
SELECT r.experiment,
       r.variant,
       {r.cell},
       r.status,
       k.layer,
       k.name AS kernel,
       k.launches,
       k.median_ms AS "median (ms)",
       k.total_ms AS "total (ms)",
       k.registers,
       k.static_shared_bytes + k.dynamic_shared_bytes AS shared_bytes,
       k.local_bytes,
       r.id AS run_id
FROM kernel k
JOIN latest_run r ON r.id = k.run_id
ORDER BY r.experiment, r.variant, {r.cell_order}, r.id, k.layer, k.name
