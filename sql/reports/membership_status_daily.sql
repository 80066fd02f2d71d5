-- model: reports.membership_status_daily
-- grain: one row per committed night, store of that night's store list and status (zeros included)
-- key: snapshot_date, storecode, status
-- enum: status in (active, frozen, on_hold, canceled, expired, other)
-- The trend the vendor cannot show: memberships by status, night after night, at the
-- membership's own storecode.
WITH statuses(status, status_order) AS (
    VALUES ('active', 1), ('frozen', 2), ('on_hold', 3), ('canceled', 4), ('expired', 5), ('other', 6)
),
by_status AS (
    SELECT as_of_date AS snapshot_date, storecode, status, count(*) AS memberships
    FROM marts.memberships_daily
    GROUP BY as_of_date, storecode, status
)
SELECT
    s.snapshot_date,
    s.storecode,
    st.status,
    coalesce(b.memberships, 0) AS memberships
FROM staging.stores AS s
CROSS JOIN statuses AS st
LEFT JOIN by_status AS b USING (snapshot_date, storecode, status)
