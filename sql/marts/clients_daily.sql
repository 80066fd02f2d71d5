-- model: marts.clients_daily
-- grain: one row per committed night and client (the client's details as of that night)
-- key: as_of_date, client_number
SELECT
    c.as_of_date,
    d.client_number,
    trim(concat_ws(' ', d.first_name, d.last_name)) AS client_name,
    d.first_name,
    d.last_name,
    d.email,
    d.phone,
    d.birth_date,
    d.gender,
    d.city,
    d.state,
    d.postal_code,
    d.home_store,
    d.referred_by,
    d.skin_type,
    d.created_date,
    d.last_modified,
    c.snapshot_date
FROM marts.client_snapshots AS c
JOIN staging.clients AS d USING (client_number, snapshot_date)
