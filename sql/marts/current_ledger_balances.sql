-- model: marts.current_ledger_balances
-- materialized: view
-- grain: one row per client and store where the client has a ledger (newest committed night)
-- key: client_number, storecode
SELECT * EXCLUDE (as_of_date)
FROM marts.ledger_balances_daily
WHERE as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
