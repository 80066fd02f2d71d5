-- model: staging.clients
-- grain: one row per client synced on the night
-- key: snapshot_date, client_number
-- source: landing.clients
-- references: staging.synced_clients (snapshot_date, client_number)
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    first_name,
    last_name,
    email,
    phone,
    birth_date,
    gender,
    address1,
    city,
    state,
    postal_code,
    home_store,
    referred_by,
    skin_type,
    created_date,
    last_modified,
    extra
FROM landing.clients
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, client_number
    ORDER BY _file_index DESC, _row DESC
) = 1
