-- model: marts.current_comm_prefs
-- grain: one row per client (communication preferences as of the newest committed night)
-- key: client_number
SELECT
    p.* EXCLUDE (extra)
FROM marts.client_snapshots AS c
JOIN staging.comm_prefs AS p USING (client_number, snapshot_date)
WHERE c.as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
