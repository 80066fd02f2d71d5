-- model: staging.points_balances
-- grain: one row per client synced on the night and store where the client has points
-- key: snapshot_date, client_number, storecode
-- source: landing.points_balances
-- references: staging.synced_clients (snapshot_date, client_number)
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    storecode,
    points,
    extra
FROM landing.points_balances
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, client_number, storecode
    ORDER BY _file_index DESC, _row DESC
) = 1
