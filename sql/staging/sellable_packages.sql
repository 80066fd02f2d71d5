-- model: staging.sellable_packages
-- grain: one row per sellable package of the night's list
-- key: snapshot_date, package_id
-- source: landing.sellable_packages
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    package_id,
    name,
    price,
    sessions,
    affiliated,
    storecode,
    extra
FROM landing.sellable_packages
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, package_id
    ORDER BY _file_index DESC, _row DESC
) = 1
