-- package_liability_roll_forward by calendar month: the opening liability of the month's first
-- night, what was sold, redeemed and expired on all its nights, the closing liability of its last
-- night (the current month: up to the newest night). Consecutive nights chain, so closing =
-- opening + sold - redeemed - expired holds for the month too. A view over
-- reports.package_liability_roll_forward_mtd: each month's newest night, whose month-to-date
-- figures stay when retention thins the month.
{{ config(materialized='scratch_view') }}

with newest as (

    {{ newest_in_month(ref('package_liability_roll_forward_mtd')) }}

),

final as (

    select
        month,
        storecode,
        as_of_date as snapshot_date,
        store_name,
        first_night,
        nights,
        opening_liability,
        sold,
        redeemed,
        expired,
        closing_liability
    from newest

)

select * from final
