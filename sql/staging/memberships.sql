-- model: staging.memberships
-- grain: one row per membership of a client synced on the night
-- key: snapshot_date, membership_id
-- source: landing.memberships
-- references: staging.synced_clients (snapshot_date, client_number)
-- enum: status in (active, frozen, on_hold, canceled, expired, other)
-- Statuses compare case-insensitively: lower-cased, with spaces, underscores and dashes
-- ignored (OnHold, on hold, ON_HOLD -> on_hold). A status outside the contract's list is
-- 'other'; the vendor's spelling stays in status_raw.
SELECT
    snapshot_date,
    client_number,
    membership_id,
    membership_type_id,
    name,
    is_eft,
    CASE replace(replace(replace(lower(trim(status)), ' ', ''), '_', ''), '-', '')
        WHEN 'active' THEN 'active'
        WHEN 'frozen' THEN 'frozen'
        WHEN 'onhold' THEN 'on_hold'
        WHEN 'canceled' THEN 'canceled'
        WHEN 'expired' THEN 'expired'
        ELSE 'other'
    END AS status,
    status AS status_raw,
    storecode,
    start_date,
    end_date,
    draw_day,
    monthly_dues,
    price,
    freeze_start_date,
    freeze_end_date,
    cancel_date,
    last_modified,
    extra
FROM landing.memberships
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, membership_id
    ORDER BY _file_index DESC, _row DESC
) = 1
