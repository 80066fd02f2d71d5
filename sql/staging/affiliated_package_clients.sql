-- model: staging.affiliated_package_clients
-- grain: one row per shared membership and client sharing it, per night
-- key: snapshot_date, membership_id, client_number
-- source: landing.affiliated_package_clients
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    membership_id,
    client_number,
    first_name,
    last_name,
    shared_date,
    extra
FROM landing.affiliated_package_clients
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, membership_id, client_number
    ORDER BY _file_index DESC, _row DESC
) = 1
