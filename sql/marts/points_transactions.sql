-- model: marts.points_transactions
-- grain: one row per points transaction, its newest fetched version
-- key: points_transaction_id
SELECT * EXCLUDE (extra)
FROM staging.points_transactions
QUALIFY row_number() OVER (PARTITION BY points_transaction_id ORDER BY snapshot_date DESC) = 1
