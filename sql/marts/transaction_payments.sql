-- model: marts.transaction_payments
-- grain: one row per transaction payment, its newest fetched version
-- key: payment_id
SELECT * EXCLUDE (extra)
FROM staging.transaction_payments
QUALIFY row_number() OVER (PARTITION BY payment_id ORDER BY snapshot_date DESC) = 1
