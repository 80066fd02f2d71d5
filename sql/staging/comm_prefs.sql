-- model: staging.comm_prefs
-- grain: one row per client synced on the night
-- key: snapshot_date, client_number
-- source: landing.comm_prefs
-- references: staging.synced_clients (snapshot_date, client_number)
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    email,
    sms,
    mail,
    phone,
    marketing,
    extra
FROM landing.comm_prefs
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, client_number
    ORDER BY _file_index DESC, _row DESC
) = 1
