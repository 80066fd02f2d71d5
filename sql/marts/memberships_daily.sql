-- model: marts.memberships_daily
-- grain: one row per committed night and membership (as of that night)
-- key: as_of_date, membership_id
-- enum: status in (active, frozen, on_hold, canceled, expired, other)
SELECT
    c.as_of_date,
    m.client_number,
    m.membership_id,
    m.membership_type_id,
    m.name,
    m.is_eft,
    m.status,
    m.status_raw,
    m.storecode,
    m.start_date,
    m.end_date,
    m.draw_day,
    m.monthly_dues,
    m.price,
    m.freeze_start_date,
    m.freeze_end_date,
    m.cancel_date,
    m.last_modified,
    c.snapshot_date
FROM marts.client_snapshots AS c
JOIN staging.memberships AS m USING (client_number, snapshot_date)
