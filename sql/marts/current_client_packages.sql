-- model: marts.current_client_packages
-- grain: one row per client and client package (as of the newest committed night)
-- key: client_number, client_package_id
SELECT
    p.* EXCLUDE (extra)
FROM marts.client_snapshots AS c
JOIN staging.client_packages AS p USING (client_number, snapshot_date)
WHERE c.as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
