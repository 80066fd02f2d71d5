-- model: marts.transactions
-- grain: one row per transaction (receipt), its newest fetched version
-- key: receipt_number
-- enum: status in (saved, voided, other)
-- Events are fetched again when they change (a later night may see a sale voided); the newest
-- fetched version wins, so a transaction voided later is voided here.
SELECT * EXCLUDE (extra)
FROM staging.transactions
QUALIFY row_number() OVER (PARTITION BY receipt_number ORDER BY snapshot_date DESC) = 1
