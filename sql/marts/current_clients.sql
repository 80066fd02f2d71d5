-- model: marts.current_clients
-- materialized: view
-- grain: one row per client (details as of the newest committed night)
-- key: client_number
SELECT * EXCLUDE (as_of_date)
FROM marts.clients_daily
WHERE as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
