-- The scorecard's snapshot figures of each store of each night's store list: active and frozen
-- memberships, MRR, amount owed (all, and 90 days or more), beside the same figures a week
-- earlier (the night 7 days before) and a month earlier (the same day of the previous month, or
-- its last day), as the warehouse held them when the night was built. Stored per night, so a
-- night keeps its comparisons when retention later removes the nights it compared with.
-- Incremental: the figures of published nights come from source history (every night stored).

with stores as (

    select * from {{ ref('stg_stores') }}

),

nights as (

    select snapshot_date from {{ source('meta', 'nights') }}

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

built as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(statuses.active, 0) as active_members,
        coalesce(statuses.frozen, 0) as frozen_memberships,
        cast(coalesce(mrr.mrr, 0) as decimal(38, 2)) as mrr,
        cast(coalesce(aging.amount_owed, 0) as decimal(38, 2)) as amount_owed,
        cast(coalesce(aging.owed_90_plus, 0) as decimal(38, 2)) as owed_90_plus
    from stores
    left join statuses using (snapshot_date, storecode)
    left join mrr using (snapshot_date, storecode)
    left join aging using (snapshot_date, storecode)

),

figures as (

    select snapshot_date, storecode, active_members, frozen_memberships, mrr, amount_owed, owed_90_plus
    from built
    {% if incremental_build() %}
    union all
    select snapshot_date, storecode, active_members, frozen_memberships, mrr, amount_owed, owed_90_plus
    from {{ source('history', 'store_figures_daily') }}
    {% endif %}

),

compared as (

    select
        built.*,
        week_night.snapshot_date as week_ago_date,
        month_night.snapshot_date as month_ago_date
    from built
    left join nights as week_night
        on week_night.snapshot_date = built.snapshot_date - 7
    left join nights as month_night
        on month_night.snapshot_date = cast(built.snapshot_date - interval 1 month as date)

),

final as (

    select
        compared.snapshot_date,
        compared.storecode,
        compared.store_name,
        compared.week_ago_date,
        compared.month_ago_date,
        compared.active_members,
        week_before.active_members as active_members_week_ago,
        month_before.active_members as active_members_month_ago,
        compared.frozen_memberships,
        week_before.frozen_memberships as frozen_memberships_week_ago,
        month_before.frozen_memberships as frozen_memberships_month_ago,
        compared.mrr,
        week_before.mrr as mrr_week_ago,
        month_before.mrr as mrr_month_ago,
        compared.amount_owed,
        week_before.amount_owed as amount_owed_week_ago,
        month_before.amount_owed as amount_owed_month_ago,
        compared.owed_90_plus,
        week_before.owed_90_plus as owed_90_plus_week_ago,
        month_before.owed_90_plus as owed_90_plus_month_ago
    from compared
    left join figures as week_before
        on week_before.snapshot_date = compared.week_ago_date and week_before.storecode = compared.storecode
    left join figures as month_before
        on month_before.snapshot_date = compared.month_ago_date and month_before.storecode = compared.storecode

)

select * from final
