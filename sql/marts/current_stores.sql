-- model: marts.current_stores
-- materialized: view
-- grain: one row per store of the newest committed night's store list
-- key: storecode
SELECT * EXCLUDE (extra)
FROM staging.stores
WHERE snapshot_date = (SELECT max(snapshot_date) FROM meta.nights)
