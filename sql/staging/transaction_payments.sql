-- model: staging.transaction_payments
-- grain: one row per transaction payment fetched on the night
-- key: snapshot_date, payment_id
-- source: landing.transaction_payments
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    receipt_number,
    payment_id,
    payment_type,
    amount,
    date,
    extra
FROM landing.transaction_payments
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, payment_id
    ORDER BY _file_index DESC, _row DESC
) = 1
