-- model: staging.stores
-- grain: one row per store of the night's store list
-- key: snapshot_date, storecode
-- source: landing.stores
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    storecode,
    name,
    city,
    state,
    timezone,
    active,
    extra
FROM landing.stores
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, storecode
    ORDER BY _file_index DESC, _row DESC
) = 1
