-- Membership churn per store and calendar month: cancellations of active memberships (the
-- roll-forward's `canceled`) over the average of the month's opening and closing active, and the
-- same over the rolling 12 months ending with the month (the months of those 12 the warehouse
-- holds): their cancellations over the average of their monthly average active. Rates are
-- rounded half-up to 4 decimals with integer arithmetic (exact); empty when the average is 0.
{{ config(materialized='scratch_view') }}

with monthly as (

    select * from {{ ref('membership_roll_forward_monthly') }}

),

rolling as (

    select
        monthly.month,
        monthly.storecode,
        count(*) as months_12m,
        cast(sum(window_months.canceled) as bigint) as canceled_12m,
        cast(sum(window_months.opening_active + window_months.closing_active) as bigint) as active_sum_12m
    from monthly
    inner join monthly as window_months
        on window_months.storecode = monthly.storecode
        and window_months.month > monthly.month - interval 12 month
        and window_months.month <= monthly.month
    group by all

),

final as (

    select
        monthly.month,
        monthly.storecode,
        monthly.snapshot_date,
        monthly.store_name,
        monthly.opening_active,
        monthly.closing_active,
        monthly.canceled,
        case
            when monthly.opening_active + monthly.closing_active = 0 then null
            -- canceled / ((o + c) / 2) = 2 canceled / (o + c), half-up to 4 decimals
            else cast(
                cast(
                    (40000 * monthly.canceled + (monthly.opening_active + monthly.closing_active))
                    // (2 * (monthly.opening_active + monthly.closing_active))
                    as decimal(18, 0)
                ) * cast(0.0001 as decimal(5, 4))
                as decimal(18, 4)
            )
        end as churn_rate,
        rolling.months_12m,
        rolling.canceled_12m,
        case
            when rolling.active_sum_12m = 0 then null
            -- canceled_12m / (active_sum_12m / (2 months)) = 2 months canceled_12m / active_sum_12m
            else cast(
                cast(
                    (20000 * 2 * rolling.months_12m * rolling.canceled_12m + rolling.active_sum_12m)
                    // (2 * rolling.active_sum_12m)
                    as decimal(18, 0)
                ) * cast(0.0001 as decimal(5, 4))
                as decimal(18, 4)
            )
        end as churn_rate_12m
    from monthly
    inner join rolling using (month, storecode)

)

select * from final
