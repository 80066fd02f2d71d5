-- model: marts.nights
-- grain: one row per committed night (its manifest)
-- key: snapshot_date
-- The nights the warehouse was built from, with what their manifests say.
SELECT
    snapshot_date,
    run_id,
    mode,
    committed_at,
    watermark,
    clients_synced
FROM meta.nights
