-- reports.package_liability_roll_forward to date within its calendar month, as of each night:
-- the opening liability of the month's first night held, what was sold, redeemed and expired on
-- its nights up to this one, the closing liability of this night (macro month_to_date: stored
-- per night, carried on from source prior).

with daily as (

    select * from {{ ref('package_liability_roll_forward') }}

),

final as (

    {{ month_to_date(
        'daily',
        source('prior', 'package_liability_roll_forward_mtd'),
        opening=['opening_liability'],
        sums=['sold', 'redeemed', 'expired'],
        closing=['closing_liability'],
        sum_type='decimal(18, 2)'
    ) }}

)

select * from final
