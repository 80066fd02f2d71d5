-- model: staging.points_transactions
-- grain: one row per points transaction fetched on the night
-- key: snapshot_date, points_transaction_id
-- source: landing.points_transactions
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    points_transaction_id,
    date,
    storecode,
    points,
    reason,
    receipt_number,
    extra
FROM landing.points_transactions
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, points_transaction_id
    ORDER BY _file_index DESC, _row DESC
) = 1
