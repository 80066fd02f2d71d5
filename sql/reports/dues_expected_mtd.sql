-- The dues EFT memberships say should be billed, month to date, as of each night, per store of
-- the night's store list: the monthly dues of each EFT membership active on a night held that is
-- its draw day (the night's day of the month), summed over the month's nights up to this one.
-- Stored per night, so a month's figure outlives its daily nights: retention may thin a month to
-- its last night, and reports.dues_billing_by_store_month reads each month's newest night (macro
-- month_to_date, carried on from source prior).

with stores as (

    select snapshot_date, storecode, name as store_name from {{ ref('stg_stores') }}

),

due_tonight as (

    select as_of_date as snapshot_date, storecode, sum(monthly_dues) as due
    from {{ ref('memberships_daily') }}
    where is_eft and status = 'active' and draw_day = extract(day from as_of_date)
    group by all

),

daily as (

    select stores.*, coalesce(due_tonight.due, 0) as expected_dues
    from stores
    left join due_tonight using (snapshot_date, storecode)

),

final as (

    {{ month_to_date(
        'daily',
        source('prior', 'dues_expected_mtd'),
        sums=['expected_dues'],
        sum_type='decimal(18, 2)',
        with_nights=false
    ) }}

)

select * from final
