-- model: reports.eft_draw_forecast
-- grain: one row per committed night, store of that night's store list, and draw day (the night's
--        draw-day list plus any day an active EFT membership uses; 0 = no draw day on the membership)
-- key: snapshot_date, storecode, draw_day
-- What the next EFT draws should bring in: active EFT memberships as of each night, at the
-- membership's storecode, by draw day; monthly_dues_total is their exact sum.
WITH active_eft AS (
    SELECT
        as_of_date AS snapshot_date,
        storecode,
        coalesce(draw_day, 0) AS draw_day,
        monthly_dues
    FROM marts.memberships_daily
    WHERE is_eft AND status = 'active'
),
days AS (
    SELECT snapshot_date, day AS draw_day FROM staging.eft_draw_days
    UNION
    SELECT snapshot_date, draw_day FROM active_eft
),
by_day AS (
    SELECT
        snapshot_date,
        storecode,
        draw_day,
        count(*) AS active_eft_memberships,
        sum(monthly_dues) AS monthly_dues_total
    FROM active_eft
    GROUP BY snapshot_date, storecode, draw_day
)
SELECT
    s.snapshot_date,
    s.storecode,
    d.draw_day,
    coalesce(b.active_eft_memberships, 0) AS active_eft_memberships,
    CAST(coalesce(b.monthly_dues_total, 0) AS DECIMAL(38, 2)) AS monthly_dues_total
FROM staging.stores AS s
JOIN days AS d USING (snapshot_date)
LEFT JOIN by_day AS b USING (snapshot_date, storecode, draw_day)
