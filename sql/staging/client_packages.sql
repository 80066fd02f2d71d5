-- model: staging.client_packages
-- grain: one row per package of a client synced on the night
-- key: snapshot_date, client_number, client_package_id
-- source: landing.client_packages
-- references: staging.synced_clients (snapshot_date, client_number)
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    client_package_id,
    package_id,
    name,
    storecode,
    purchase_date,
    expiration_date,
    sessions_total,
    sessions_remaining,
    shared_from_client_number,
    extra
FROM landing.client_packages
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, client_number, client_package_id
    ORDER BY _file_index DESC, _row DESC
) = 1
