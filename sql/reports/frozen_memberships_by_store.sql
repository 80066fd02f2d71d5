-- Memberships as of each night, counted at the membership's own storecode, by normalised status
-- (other = a status outside the contract's list). frozen_rate = frozen / (active + frozen),
-- rounded half-up to 4 decimals with integer arithmetic (exact), null when both are 0.

with stores as (

    select * from {{ ref('stg_stores') }}

),

memberships as (

    select * from {{ ref('memberships_daily') }}

),

by_store as (

    select
        as_of_date as snapshot_date,
        storecode,
        count(*) filter (where status = 'active') as active,
        count(*) filter (where status = 'frozen') as frozen,
        count(*) filter (where status = 'on_hold') as on_hold,
        count(*) filter (where status = 'canceled') as canceled,
        count(*) filter (where status = 'expired') as expired,
        count(*) filter (where status = 'other') as other
    from memberships
    group by as_of_date, storecode

),

counts as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(by_store.active, 0) as active,
        coalesce(by_store.frozen, 0) as frozen,
        coalesce(by_store.on_hold, 0) as on_hold,
        coalesce(by_store.canceled, 0) as canceled,
        coalesce(by_store.expired, 0) as expired,
        coalesce(by_store.other, 0) as other
    from stores
    left join by_store using (snapshot_date, storecode)

),

final as (

    select
        *,
        case
            when active + frozen = 0 then null
            -- round(frozen * 10000 / d) half-up = floor((20000 * frozen + d) / (2 * d))
            else cast(
                cast((20000 * frozen + (active + frozen)) // (2 * (active + frozen)) as decimal(18, 0))
                * cast(0.0001 as decimal(5, 4))
                as decimal(9, 4)
            )
        end as frozen_rate
    from counts

)

select * from final
