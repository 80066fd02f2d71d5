-- model: marts.ledger_balances_daily
-- grain: one row per committed night, client and store where the client has a ledger that night
-- key: as_of_date, client_number, storecode
-- balance > 0: owed by the client; < 0: credit. Exact DECIMAL(18, 2).
SELECT
    c.as_of_date,
    l.client_number,
    l.storecode,
    l.balance,
    l.as_of,
    c.snapshot_date
FROM marts.client_snapshots AS c
JOIN staging.ledger_balances AS l USING (client_number, snapshot_date)
