-- One row per store of each night's store list: the night's key figures beside the same figures
-- a week earlier (the night 7 days before) and a month earlier (the same day of the previous
-- month, or its last day); a compared night the warehouse does not hold, or a store it did not
-- list, leaves the figure empty. revenue_7d is the store's revenue (before tax, voids excluded)
-- of the 7 local business days ending with the night. A view over the reports it compares.
{{ config(materialized='scratch_view') }}

with stores as (

    select * from {{ ref('stg_stores') }}

),

nights as (

    select snapshot_date from {{ ref('nights') }}

),

statuses as (

    select snapshot_date, storecode, active, frozen
    from {{ ref('frozen_memberships_by_store') }}

),

mrr as (

    select snapshot_date, storecode, mrr from {{ ref('mrr_by_store') }}

),

aging as (

    select snapshot_date, storecode, amount_owed, owed_90_plus
    from {{ ref('balance_aging_by_store') }}

),

revenue as (

    select storecode, business_date, amount from {{ ref('revenue_by_store_day') }}

),

revenue_7d as (

    select stores.snapshot_date, stores.storecode, sum(revenue.amount) as revenue_7d
    from stores
    inner join revenue
        on revenue.storecode = stores.storecode
        and revenue.business_date > stores.snapshot_date - 7
        and revenue.business_date <= stores.snapshot_date
    group by all

),

figures as (

    select
        stores.snapshot_date,
        stores.storecode,
        coalesce(statuses.active, 0) as active_members,
        coalesce(statuses.frozen, 0) as frozen_memberships,
        cast(coalesce(mrr.mrr, 0) as decimal(38, 2)) as mrr,
        cast(coalesce(aging.amount_owed, 0) as decimal(38, 2)) as amount_owed,
        cast(coalesce(aging.owed_90_plus, 0) as decimal(38, 2)) as owed_90_plus,
        cast(coalesce(revenue_7d.revenue_7d, 0) as decimal(38, 2)) as revenue_7d
    from stores
    left join statuses using (snapshot_date, storecode)
    left join mrr using (snapshot_date, storecode)
    left join aging using (snapshot_date, storecode)
    left join revenue_7d using (snapshot_date, storecode)

),

compared as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        week_night.snapshot_date as week_ago_date,
        month_night.snapshot_date as month_ago_date
    from stores
    left join nights as week_night
        on week_night.snapshot_date = stores.snapshot_date - 7
    left join nights as month_night
        on month_night.snapshot_date = cast(stores.snapshot_date - interval 1 month as date)

),

final as (

    select
        compared.snapshot_date,
        compared.storecode,
        compared.store_name,
        compared.week_ago_date,
        compared.month_ago_date,
        tonight.active_members,
        week_before.active_members as active_members_week_ago,
        month_before.active_members as active_members_month_ago,
        tonight.frozen_memberships,
        week_before.frozen_memberships as frozen_memberships_week_ago,
        month_before.frozen_memberships as frozen_memberships_month_ago,
        tonight.mrr,
        week_before.mrr as mrr_week_ago,
        month_before.mrr as mrr_month_ago,
        tonight.amount_owed,
        week_before.amount_owed as amount_owed_week_ago,
        month_before.amount_owed as amount_owed_month_ago,
        tonight.owed_90_plus,
        week_before.owed_90_plus as owed_90_plus_week_ago,
        month_before.owed_90_plus as owed_90_plus_month_ago,
        tonight.revenue_7d,
        week_before.revenue_7d as revenue_7d_week_ago,
        month_before.revenue_7d as revenue_7d_month_ago
    from compared
    inner join figures as tonight using (snapshot_date, storecode)
    left join figures as week_before
        on week_before.snapshot_date = compared.week_ago_date and week_before.storecode = compared.storecode
    left join figures as month_before
        on month_before.snapshot_date = compared.month_ago_date and month_before.storecode = compared.storecode

)

select * from final
