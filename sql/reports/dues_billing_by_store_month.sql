-- Dues the memberships say should be billed beside the dues billed, per store and calendar month.
-- expected_dues: reports.dues_expected_mtd on the month's newest night held (the nights held
-- only: a month before the first night, or a draw day whose night is not held, is not guessed).
-- billed_dues: the membership-fee lines (type 1) of the store's saved sales dated in the month
-- (local business date), before tax, in their newest fetched version (a late void shows).
-- gap = expected_dues - billed_dues. Rows: each month of the nights held, and each store listed
-- on a night of that month (its name on the newest of them).
{{ config(materialized='scratch_view') }}

with expected as (

    {{ newest_in_month(ref('dues_expected_mtd')) }}

),

billed as (

    select
        cast(date_trunc('month', business_date) as date) as month,
        storecode,
        sum(amount) as billed_dues
    from {{ ref('sales_lines') }}
    where type = '1' and not is_voided
    group by all

),

final as (

    select
        expected.month,
        expected.storecode,
        expected.store_name,
        expected.expected_dues,
        cast(coalesce(billed.billed_dues, 0) as decimal(18, 2)) as billed_dues,
        cast(expected.expected_dues - coalesce(billed.billed_dues, 0) as decimal(18, 2)) as gap
    from expected
    left join billed using (month, storecode)

)

select * from final
