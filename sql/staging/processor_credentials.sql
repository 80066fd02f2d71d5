-- model: staging.processor_credentials
-- grain: one row per store asked, credential type, processor and merchant, per night (secrets never land)
-- key: snapshot_date, query_storecode, credential_type, processor, merchant_id
-- source: landing.processor_credentials
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    query_storecode,
    credential_type,
    processor,
    merchant_id,
    extra
FROM landing.processor_credentials
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, query_storecode, credential_type, processor, merchant_id
    ORDER BY _file_index DESC, _row DESC
) = 1
