-- reports.membership_roll_forward to date within its calendar month, as of each night: the
-- opening of the month's first night held, the movements of its nights up to this one, the
-- closing of this night (macro month_to_date: stored per night, carried on from source prior).

with daily as (

    select * from {{ ref('membership_roll_forward') }}

),

final as (

    {{ month_to_date(
        'daily',
        source('prior', 'membership_roll_forward_mtd'),
        opening=['opening_active'],
        sums=['new', 'reactivated', 'frozen', 'canceled', 'expired'],
        closing=['closing_active']
    ) }}

)

select * from final
