-- model: staging.payment_types
-- grain: one row per store asked and payment type, per night
-- key: snapshot_date, query_storecode, code
-- source: landing.payment_types
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    query_storecode,
    code,
    description,
    kind,
    extra
FROM landing.payment_types
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, query_storecode, code
    ORDER BY _file_index DESC, _row DESC
) = 1
