-- model: marts.current_memberships
-- materialized: view
-- grain: one row per membership (as of the newest committed night)
-- key: membership_id
SELECT * EXCLUDE (as_of_date)
FROM marts.memberships_daily
WHERE as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
