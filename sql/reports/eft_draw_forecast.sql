-- What the next EFT draws should bring in: active EFT memberships as of each night, at the
-- membership's storecode, by draw day (the night's draw-day list plus any day an active EFT
-- membership uses; 0 = no draw day on the membership); monthly_dues_total is their exact sum.

with stores as (

    select * from {{ ref('stg_stores') }}

),

draw_days as (

    select * from {{ ref('stg_eft_draw_days') }}

),

memberships as (

    select * from {{ ref('memberships_daily') }}

),

active_eft as (

    select
        as_of_date as snapshot_date,
        storecode,
        coalesce(draw_day, 0) as draw_day,
        monthly_dues
    from memberships
    where is_eft and status = 'active'

),

days as (

    select snapshot_date, day as draw_day from draw_days
    union
    select snapshot_date, draw_day from active_eft

),

by_day as (

    select
        snapshot_date,
        storecode,
        draw_day,
        count(*) as active_eft_memberships,
        sum(monthly_dues) as monthly_dues_total
    from active_eft
    group by snapshot_date, storecode, draw_day

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        days.draw_day,
        coalesce(by_day.active_eft_memberships, 0) as active_eft_memberships,
        cast(coalesce(by_day.monthly_dues_total, 0) as decimal(38, 2)) as monthly_dues_total
    from stores
    inner join days using (snapshot_date)
    left join by_day using (snapshot_date, storecode, draw_day)

)

select * from final
