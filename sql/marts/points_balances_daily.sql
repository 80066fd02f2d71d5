-- model: marts.points_balances_daily
-- grain: one row per committed night, client and store where the client has points that night
-- key: as_of_date, client_number, storecode
SELECT
    c.as_of_date,
    p.client_number,
    p.storecode,
    p.points,
    c.snapshot_date
FROM marts.client_snapshots AS c
JOIN staging.points_balances AS p USING (client_number, snapshot_date)
