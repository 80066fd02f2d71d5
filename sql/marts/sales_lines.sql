-- model: marts.sales_lines
-- grain: one row per transaction line, with its transaction's store, local business date and status
-- key: receipt_number, line_no
-- A line whose transaction header did not land has a null storecode and business_date (the
-- revenue report's key checks then fail loudly rather than drop revenue silently).
SELECT
    l.receipt_number,
    l.line_no,
    t.storecode,
    t.business_date,
    t.transaction_date,
    t.status AS transaction_status,
    coalesce(t.is_voided, false) AS is_voided,
    l.client_number,
    l.type,
    l.type_raw,
    l.product_number,
    l.package_id,
    l.membership_id,
    l.gift_cert_no,
    l.description,
    l.quantity,
    l.price_per_unit,
    l.amount,
    l.tax
FROM marts.transaction_lines AS l
LEFT JOIN marts.transactions AS t USING (receipt_number)
