-- model: marts.transaction_lines
-- grain: one row per transaction line, its newest fetched version
-- key: receipt_number, line_no
-- enum: type in (R, P, M, 1, G, other)
SELECT * EXCLUDE (extra)
FROM staging.transaction_lines
QUALIFY row_number() OVER (PARTITION BY receipt_number, line_no ORDER BY snapshot_date DESC) = 1
