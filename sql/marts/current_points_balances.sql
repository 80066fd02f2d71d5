-- model: marts.current_points_balances
-- materialized: view
-- grain: one row per client and store where the client has points (newest committed night)
-- key: client_number, storecode
SELECT * EXCLUDE (as_of_date)
FROM marts.points_balances_daily
WHERE as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
