-- One row per store of each night's store list: the night's key figures beside the same figures
-- a week earlier (the night 7 days before) and a month earlier (the same day of the previous
-- month, or its last day); a compared night the warehouse did not hold, or a store it did not
-- list, leaves the figure empty. The snapshot figures and the compared nights are stored per
-- night (reports.store_figures_daily: they stay when retention removes older nights); revenue_7d,
-- the store's revenue (before tax, voids excluded) of the 7 local business days ending with the
-- night, is read live from reports.revenue_by_store_day (a late void shows on every night).
{{ config(materialized='scratch_view') }}

with figures as (

    select * from {{ ref('store_figures_daily') }}

),

revenue as (

    select storecode, business_date, amount from {{ ref('revenue_by_store_day') }}

),

revenue_7d as (

    -- a store's revenue of the 7 local business days ending with each night it may be compared on
    select days.storecode, days.night, sum(revenue.amount) as revenue_7d
    from (
        select storecode, snapshot_date as night from figures
        union
        select storecode, week_ago_date from figures where week_ago_date is not null
        union
        select storecode, month_ago_date from figures where month_ago_date is not null
    ) as days
    inner join revenue
        on revenue.storecode = days.storecode
        and revenue.business_date > days.night - 7
        and revenue.business_date <= days.night
    group by all

),

final as (

    select
        figures.*,
        cast(coalesce(tonight.revenue_7d, 0) as decimal(38, 2)) as revenue_7d,
        -- compared only where the store was on that night's list (its figures are there)
        case when figures.active_members_week_ago is not null
            then cast(coalesce(week_before.revenue_7d, 0) as decimal(38, 2)) end as revenue_7d_week_ago,
        case when figures.active_members_month_ago is not null
            then cast(coalesce(month_before.revenue_7d, 0) as decimal(38, 2)) end as revenue_7d_month_ago
    from figures
    left join revenue_7d as tonight
        on tonight.storecode = figures.storecode and tonight.night = figures.snapshot_date
    left join revenue_7d as week_before
        on week_before.storecode = figures.storecode and week_before.night = figures.week_ago_date
    left join revenue_7d as month_before
        on month_before.storecode = figures.storecode and month_before.night = figures.month_ago_date

)

select * from final
