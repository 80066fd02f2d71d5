-- model: staging.transaction_lines
-- grain: one row per transaction line fetched on the night
-- key: snapshot_date, receipt_number, line_no
-- source: landing.transaction_lines
-- enum: type in (R, P, M, 1, G, other)
-- Line types compare case-insensitively (upper-cased); a type outside the contract's list is
-- 'other', the vendor's spelling stays in type_raw. amount is before tax.
SELECT
    snapshot_date,
    client_number,
    receipt_number,
    line_no,
    CASE upper(trim(type))
        WHEN 'R' THEN 'R'
        WHEN 'P' THEN 'P'
        WHEN 'M' THEN 'M'
        WHEN '1' THEN '1'
        WHEN 'G' THEN 'G'
        ELSE 'other'
    END AS type,
    type AS type_raw,
    product_number,
    package_id,
    membership_id,
    gift_cert_no,
    description,
    quantity,
    price_per_unit,
    amount,
    tax,
    extra
FROM landing.transaction_lines
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, receipt_number, line_no
    ORDER BY _file_index DESC, _row DESC
) = 1
