-- model: staging.synced_clients
-- grain: one row per client synced on the night (the client's whole state landed that night)
-- key: snapshot_date, client_number
-- source: landing.synced_clients
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    home_store,
    last_modified,
    extra
FROM landing.synced_clients
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, client_number
    ORDER BY _file_index DESC, _row DESC
) = 1
