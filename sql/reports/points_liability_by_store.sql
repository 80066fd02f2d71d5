-- Loyalty points owed to clients as of each night, per store of the night's store list: only
-- positive balances are a liability.

with stores as (

    select * from {{ ref('stg_stores') }}

),

points as (

    select * from {{ ref('points_balances_daily') }}

),

by_store as (

    select
        as_of_date as snapshot_date,
        storecode,
        count(*) filter (where points > 0) as clients_with_points,
        sum(points) filter (where points > 0) as points_outstanding
    from points
    group by as_of_date, storecode

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(by_store.clients_with_points, 0) as clients_with_points,
        cast(coalesce(by_store.points_outstanding, 0) as bigint) as points_outstanding
    from stores
    left join by_store using (snapshot_date, storecode)

)

select * from final
