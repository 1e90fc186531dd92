-- How fast (and how noisy: ±%) and how accurate is each variant at each batch size and stream count (the seeds' report table), and can each number be trusted (verdict)?
-- One row per cell: every axis of the sweep is a column ({cell}), so two runs that differ only in, say, their
-- timer never read as one. ±%: how noisy the time beside it is, its samples' median absolute deviation in % of
-- their median; text with one decimal, which a table cell would otherwise pad to four significant digits. The
-- experiment comes first: the default sweep holds two, and one's warm rows would otherwise read as duplicates of
-- the other's.
-- verdict (the view's, convsweep/store/views.py): empty for a trusted run; "fast checks" for one measured with
-- `checks: fast` (no caching test); "not fresh" for one some of whose timed passes ran on inputs its kernel had
-- seen; "suspect: " and the first of its reasons for a run whose times the integrity checks doubt (faster than
-- the physical floor, faster on a round it had seen, work outside the timer). Shown, never counted as fastest.
-- `convsweep query failures` has every reason in full. Incorrect and failed runs have no number to show.
-- forward × floor: the host-to-host pass over its floor at this GPU's measured rates (convsweep/device/floors.py: the
-- input up, the compute, the logits down, pipelined over the chunks): 1.2 means within 20% of what this machine
-- allows. Empty until `convsweep bench --ceilings-only --db URL` has measured the GPU's rates (seconds, once per
-- machine).
SELECT experiment,
       variant,
       {cell},
       op_time_1_ms AS "op time 1 (ms)",
       CAST(ROUND(CAST(100 * op_time_1_spread AS NUMERIC), 1) AS VARCHAR) AS "op time 1 ±%",
       op_time_2_ms AS "op time 2 (ms)",
       CAST(ROUND(CAST(100 * op_time_2_spread AS NUMERIC), 1) AS VARCHAR) AS "op time 2 ±%",
       forward_ms AS "forward (ms)",
       CAST(ROUND(CAST(100 * forward_spread AS NUMERIC), 1) AS VARCHAR) AS "forward ±%",
       CAST(ROUND(CAST(forward_ms / NULLIF(forward_floor_ms, 0) AS NUMERIC), 2) AS VARCHAR) AS "forward × floor",
       total_s AS "total (s)",
       accuracy,
       CASE WHEN verdict = 'suspect'
            THEN 'suspect' || CASE WHEN checks = 'fast' THEN ' (fast checks)' ELSE '' END || ': '
                 || CASE WHEN length(error) > 60 THEN substr(error, 1, 57) || '...'
                         ELSE COALESCE(error, 'no reason stored') END
            WHEN verdict = 'ok' THEN ''
            ELSE replace(verdict, '-', ' ')
       END AS verdict
FROM run_summary s
WHERE s.verdict NOT IN ('incorrect', 'failed')
ORDER BY experiment, variant, {cell_order}, run_id
