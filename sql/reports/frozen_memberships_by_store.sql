-- model: reports.frozen_memberships_by_store
-- grain: one row per committed night and store of that night's store list (zeros where a store has nothing)
-- key: snapshot_date, storecode
-- Memberships as of each night, counted at the membership's own storecode, by normalised
-- status (other = a status outside the contract's list). frozen_rate = frozen / (active +
-- frozen), rounded half-up to 4 decimals with integer arithmetic (exact), null when both are 0.
WITH by_store AS (
    SELECT
        as_of_date AS snapshot_date,
        storecode,
        count(*) FILTER (WHERE status = 'active') AS active,
        count(*) FILTER (WHERE status = 'frozen') AS frozen,
        count(*) FILTER (WHERE status = 'on_hold') AS on_hold,
        count(*) FILTER (WHERE status = 'canceled') AS canceled,
        count(*) FILTER (WHERE status = 'expired') AS expired,
        count(*) FILTER (WHERE status = 'other') AS other
    FROM marts.memberships_daily
    GROUP BY as_of_date, storecode
),
counts AS (
    SELECT
        s.snapshot_date,
        s.storecode,
        s.name AS store_name,
        coalesce(b.active, 0) AS active,
        coalesce(b.frozen, 0) AS frozen,
        coalesce(b.on_hold, 0) AS on_hold,
        coalesce(b.canceled, 0) AS canceled,
        coalesce(b.expired, 0) AS expired,
        coalesce(b.other, 0) AS other
    FROM staging.stores AS s
    LEFT JOIN by_store AS b USING (snapshot_date, storecode)
)
SELECT
    *,
    CASE
        WHEN active + frozen = 0 THEN NULL
        -- round(frozen * 10000 / d) half-up = floor((20000 * frozen + d) / (2 * d))
        ELSE CAST(
            CAST((20000 * frozen + (active + frozen)) // (2 * (active + frozen)) AS DECIMAL(18, 0))
            * CAST(0.0001 AS DECIMAL(5, 4))
            AS DECIMAL(9, 4)
        )
    END AS frozen_rate
FROM counts
