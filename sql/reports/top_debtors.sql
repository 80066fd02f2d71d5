-- model: reports.top_debtors
-- grain: one row per committed night, store of that night's store list and client among the 50
--        largest positive balances at that store (ties broken by client_number)
-- key: snapshot_date, storecode, client_number
-- active_memberships and eft_on_file (a billing account on file) are the client's, across stores,
-- as of the night; last_payment_date is the client's newest payment on a non-voided transaction
-- at this store, on or before the night (store-local date).
WITH ranked AS (
    SELECT
        l.as_of_date AS snapshot_date,
        l.storecode,
        l.client_number,
        l.balance,
        row_number() OVER (
            PARTITION BY l.as_of_date, l.storecode ORDER BY l.balance DESC, l.client_number
        ) AS rank_at_store
    FROM marts.ledger_balances_daily AS l
    JOIN staging.stores AS s ON s.snapshot_date = l.as_of_date AND s.storecode = l.storecode
    WHERE l.balance > 0
),
top AS (
    SELECT * FROM ranked WHERE rank_at_store <= 50
),
active_memberships AS (
    SELECT as_of_date AS snapshot_date, client_number, count(*) AS active_memberships
    FROM marts.memberships_daily
    WHERE status = 'active'
    GROUP BY ALL
),
eft_on_file AS (
    SELECT DISTINCT as_of_date AS snapshot_date, client_number
    FROM marts.billing_accounts_daily
),
payments AS (
    SELECT p.client_number, t.storecode, CAST(p.date AS DATE) AS payment_date
    FROM marts.transaction_payments AS p
    JOIN marts.transactions AS t USING (receipt_number)
    WHERE NOT t.is_voided AND p.date IS NOT NULL
),
last_payment AS (
    SELECT top.snapshot_date, top.storecode, top.client_number, max(p.payment_date) AS last_payment_date
    FROM top
    JOIN payments AS p
        ON p.client_number = top.client_number
        AND p.storecode = top.storecode
        AND p.payment_date <= top.snapshot_date
    GROUP BY ALL
)
SELECT
    top.snapshot_date,
    top.storecode,
    top.client_number,
    c.client_name,
    top.balance,
    coalesce(a.active_memberships, 0) AS active_memberships,
    e.client_number IS NOT NULL AS eft_on_file,
    lp.last_payment_date
FROM top
LEFT JOIN marts.clients_daily AS c
    ON c.as_of_date = top.snapshot_date AND c.client_number = top.client_number
LEFT JOIN active_memberships AS a
    ON a.snapshot_date = top.snapshot_date AND a.client_number = top.client_number
LEFT JOIN eft_on_file AS e
    ON e.snapshot_date = top.snapshot_date AND e.client_number = top.client_number
LEFT JOIN last_payment AS lp
    ON lp.snapshot_date = top.snapshot_date
    AND lp.storecode = top.storecode
    AND lp.client_number = top.client_number
