-- Did measuring each cell's fastest settings again, interleaved (`confirm:` in the sweep), keep the first ranking's winner of each conv layer and batch, or overturn it?
-- One row per cell, layer and batch of its latest confirmation, while each run it measured again is still its
-- setting's latest (the view latest_confirmation): the confirmed winner and its median over the rounds, how many
-- settings a paired test could not tell from it, the smallest difference from the runner-up those rounds would
-- have found, and the first ranking's winner with its standing now (winner, tied, slower, incorrect, failed).
-- ranking: "overturned" where the first winner is neither the confirmed winner nor tied with it. cell: the
-- confirm job (convsweep/measure/confirm.py).
SELECT w.experiment,
       'op time ' || CAST(w.layer_index + 1 AS VARCHAR) AS layer,
       w.batch,
       w.variant AS "confirmed winner",
       w.params AS tunables,
       w.median_ms AS "confirmed (ms)",
       (SELECT COUNT(*) FROM latest_confirmation t
        WHERE t.confirmation_id = w.confirmation_id AND t.layer_index = w.layer_index AND t.standing = 'tied') AS tied,
       w.detectable_ms AS "detectable (ms)",
       f.variant AS "first winner",
       f.params AS "first tunables",
       f.standing AS "first winner now",
       CASE WHEN w.overturned THEN 'overturned' ELSE 'held' END AS ranking,
       w.rounds,
       w.sm_clock_mhz AS "SM MHz",
       w.sm_clock_after_mhz AS "SM MHz after",
       w.group_id AS cell
FROM latest_confirmation w
JOIN latest_confirmation f ON f.confirmation_id = w.confirmation_id AND f.layer_index = w.layer_index AND f.first_place = 1
WHERE w.standing = 'winner'
ORDER BY w.experiment, w.layer_index, w.batch, w.group_id
