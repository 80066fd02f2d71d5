-- model: staging.products
-- grain: one row per store asked and product, per night
-- key: snapshot_date, query_storecode, product_number
-- source: landing.products
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    query_storecode,
    product_number,
    name,
    price,
    category,
    storecode,
    extra
FROM landing.products
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, query_storecode, product_number
    ORDER BY _file_index DESC, _row DESC
) = 1
