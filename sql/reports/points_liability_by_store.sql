-- model: reports.points_liability_by_store
-- grain: one row per committed night and store of that night's store list (zeros where a store has nothing)
-- key: snapshot_date, storecode
-- Loyalty points owed to clients as of each night: only positive balances are a liability.
WITH by_store AS (
    SELECT
        as_of_date AS snapshot_date,
        storecode,
        count(*) FILTER (WHERE points > 0) AS clients_with_points,
        sum(points) FILTER (WHERE points > 0) AS points_outstanding
    FROM marts.points_balances_daily
    GROUP BY as_of_date, storecode
)
SELECT
    s.snapshot_date,
    s.storecode,
    s.name AS store_name,
    coalesce(b.clients_with_points, 0) AS clients_with_points,
    CAST(coalesce(b.points_outstanding, 0) AS BIGINT) AS points_outstanding
FROM staging.stores AS s
LEFT JOIN by_store AS b USING (snapshot_date, storecode)
