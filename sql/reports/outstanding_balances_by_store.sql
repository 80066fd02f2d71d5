-- model: reports.outstanding_balances_by_store
-- grain: one row per committed night and store of that night's store list (zeros where a store has nothing)
-- key: snapshot_date, storecode
-- Ledger balances as of each night (each client's newest snapshot): positive = owed by the
-- client, negative = credit. Money is exact DECIMAL: amount_owed - credit_amount = net_balance.
WITH by_store AS (
    SELECT
        as_of_date AS snapshot_date,
        storecode,
        count(*) FILTER (WHERE balance > 0) AS clients_owing,
        sum(balance) FILTER (WHERE balance > 0) AS amount_owed,
        count(*) FILTER (WHERE balance < 0) AS clients_in_credit,
        -sum(balance) FILTER (WHERE balance < 0) AS credit_amount,
        sum(balance) AS net_balance
    FROM marts.ledger_balances_daily
    GROUP BY as_of_date, storecode
)
SELECT
    s.snapshot_date,
    s.storecode,
    s.name AS store_name,
    coalesce(b.clients_owing, 0) AS clients_owing,
    CAST(coalesce(b.amount_owed, 0) AS DECIMAL(38, 2)) AS amount_owed,
    coalesce(b.clients_in_credit, 0) AS clients_in_credit,
    CAST(coalesce(b.credit_amount, 0) AS DECIMAL(38, 2)) AS credit_amount,
    CAST(coalesce(b.net_balance, 0) AS DECIMAL(38, 2)) AS net_balance
FROM staging.stores AS s
LEFT JOIN by_store AS b USING (snapshot_date, storecode)
