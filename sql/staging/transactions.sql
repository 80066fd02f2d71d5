-- model: staging.transactions
-- grain: one row per transaction (receipt) fetched on the night
-- key: snapshot_date, receipt_number
-- source: landing.transactions
-- enum: status in (saved, voided, other)
-- transaction_date is the store's local time (the landing zone converted any offset);
-- business_date is its local calendar day. Voided sales are not revenue.
SELECT
    snapshot_date,
    client_number,
    receipt_number,
    transaction_date,
    CAST(transaction_date AS DATE) AS business_date,
    storecode,
    emp_no,
    CASE lower(trim(status))
        WHEN 'saved' THEN 'saved'
        WHEN 'voided' THEN 'voided'
        ELSE 'other'
    END AS status,
    status AS status_raw,
    coalesce(lower(trim(status)) = 'voided', false) AS is_voided,
    extra
FROM landing.transactions
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, receipt_number
    ORDER BY _file_index DESC, _row DESC
) = 1
