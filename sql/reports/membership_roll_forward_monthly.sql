-- membership_roll_forward by calendar month: the opening of the month's first night, the
-- movements of all its nights, the closing of its last night (the current month: up to the
-- newest night). Consecutive nights chain, so closing = opening + new + reactivated - frozen
-- - canceled - expired holds for the month too. A view over reports.membership_roll_forward_mtd:
-- each month's newest night, whose month-to-date figures stay when retention thins the month.
{{ config(materialized='scratch_view') }}

with newest as (

    {{ newest_in_month(ref('membership_roll_forward_mtd')) }}

),

final as (

    select
        month,
        storecode,
        as_of_date as snapshot_date,
        store_name,
        first_night,
        nights,
        opening_active,
        new,
        reactivated,
        frozen,
        canceled,
        expired,
        closing_active
    from newest

)

select * from final
