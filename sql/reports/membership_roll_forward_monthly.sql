-- membership_roll_forward by calendar month: the opening of the month's first night, the
-- movements of all its nights, the closing of its last night (the current month: up to the
-- newest night). Consecutive nights chain, so closing = opening + new + reactivated - frozen
-- - canceled - expired holds for the month too. A view: always the whole history.
{{ config(materialized='scratch_view') }}

with daily as (

    select * from {{ ref('membership_roll_forward') }}

),

final as (

    select
        cast(date_trunc('month', snapshot_date) as date) as month,
        storecode,
        max(snapshot_date) as snapshot_date,
        arg_max(store_name, snapshot_date) as store_name,
        min(snapshot_date) as first_night,
        count(*) as nights,
        arg_min(opening_active, snapshot_date) as opening_active,
        cast(sum(new) as bigint) as new,
        cast(sum(reactivated) as bigint) as reactivated,
        cast(sum(frozen) as bigint) as frozen,
        cast(sum(canceled) as bigint) as canceled,
        cast(sum(expired) as bigint) as expired,
        arg_max(closing_active, snapshot_date) as closing_active
    from daily
    group by all

)

select * from final
