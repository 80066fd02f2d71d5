-- Member cohorts: the clients whose first membership (earliest start date) began in a month, at
-- that membership's store; for each month since, how many still hold a membership and what the
-- cohort has spent per client to date (lifetime value).
-- Still a member at a month's end: from our nightly history from its first night on (a membership
-- active or frozen on the newest night held on or before the month's last day, or the newest night
-- for the current month: a client's state as of a night is their newest snapshot); for a month
-- before our history, from the membership dates (started by its last day, neither canceled nor
-- ended by then).
-- Revenue: the sales lines (before tax) of the client's saved sales at any store dated up to the
-- month's end (the current month: the newest night), in their newest fetched version; gift
-- certificates are left out (a certificate sold is owed, not earned: what it buys is a line of
-- its own). Dates come from each membership's newest version. A view over the history held.
{{ config(materialized='scratch_view') }}

with memberships as (

    select * from {{ ref('memberships_daily') }}

),

nights as (

    select snapshot_date from {{ ref('nights') }}

),

stores as (

    select storecode, name as store_name from {{ ref('current_stores') }}

),

lines as (

    select * from {{ ref('sales_lines') }}

),

newest_versions as (

    select * from memberships
    qualify row_number() over (partition by client_key, membership_id order by as_of_date desc) = 1

),

joiners as (

    -- each client's first membership: its month is the client's cohort, its store the cohort's
    select client_key, storecode, cast(date_trunc('month', start_date) as date) as cohort_month
    from newest_versions
    where start_date is not null
    qualify row_number() over (partition by client_key order by start_date, membership_id) = 1

),

months as (

    -- every month from the oldest cohort to the newest night's, the day it is read as of, and the
    -- newest night held on or before that day (null: the month is before our history)
    select
        spine.month,
        spine.as_of_date,
        (select max(snapshot_date) from nights where snapshot_date <= spine.as_of_date) as night_held
    from (
        select
            cast(series.month as date) as month,
            least(cast(series.month + interval 1 month - interval 1 day as date), bounds.newest_night)
                as as_of_date
        from (
            select
                (select min(cohort_month) from joiners) as oldest_month,
                (select max(snapshot_date) from nights) as newest_night
        ) as bounds,
            unnest(generate_series(bounds.oldest_month, bounds.newest_night, interval 1 month)) as series (month)
    ) as spine

),

members_held as (

    select distinct months.month, memberships.client_key
    from months
    inner join memberships on memberships.as_of_date = months.night_held
    where memberships.status in ('active', 'frozen')

),

members_dated as (

    select distinct months.month, newest_versions.client_key
    from months
    inner join newest_versions
        on newest_versions.start_date <= months.as_of_date
        and coalesce(newest_versions.cancel_date > months.as_of_date, true)
        and coalesce(newest_versions.end_date > months.as_of_date, true)
    where months.night_held is null

),

cohorts as (

    select cohort_month, storecode, count(*) as cohort_size
    from joiners
    group by all

),

grid as (

    select
        cohorts.*,
        months.month,
        months.as_of_date,
        cast(datediff('month', cohorts.cohort_month, months.month) as integer) as months_since_join
    from cohorts
    inner join months on months.month >= cohorts.cohort_month

),

still_members as (

    select joiners.cohort_month, joiners.storecode, members.month, count(*) as still_members
    from joiners
    inner join (select * from members_held union all select * from members_dated) as members
        on members.client_key = joiners.client_key and members.month >= joiners.cohort_month
    group by all

),

revenue_by_month as (

    -- a cohort's revenue by month; what its clients spent before joining counts in its first month
    select
        joiners.cohort_month,
        joiners.storecode,
        greatest(cast(date_trunc('month', lines.business_date) as date), joiners.cohort_month) as month,
        sum(lines.amount) as revenue
    from joiners
    inner join lines on lines.client_key = joiners.client_key
    where not lines.is_voided
        and lines.type <> 'G'
        and lines.business_date <= (select max(snapshot_date) from nights)
    group by all

),

revenue_to_date as (

    select
        grid.cohort_month,
        grid.storecode,
        grid.month,
        cast(
            coalesce(sum(revenue_by_month.revenue) over to_date, 0) as decimal(18, 2)
        ) as revenue_to_date
    from grid
    left join revenue_by_month using (cohort_month, storecode, month)
    window to_date as (
        partition by grid.cohort_month, grid.storecode
        order by grid.month
        rows between unbounded preceding and current row
    )

),

final as (

    select
        grid.cohort_month,
        grid.storecode,
        stores.store_name,
        grid.months_since_join,
        grid.month,
        grid.as_of_date,
        grid.cohort_size,
        coalesce(still_members.still_members, 0) as still_members,
        -- still_members / cohort_size, half-up to 4 decimals (exact integer arithmetic)
        cast(
            cast(
                (20000 * coalesce(still_members.still_members, 0) + grid.cohort_size) // (2 * grid.cohort_size)
                as decimal(18, 0)
            ) * cast(0.0001 as decimal(5, 4))
            as decimal(18, 4)
        ) as retention_rate,
        revenue_to_date.revenue_to_date,
        -- revenue_to_date / cohort_size in cents, half-up (away from zero), exact integer arithmetic
        cast(
            cast(
                sign(revenue_to_date.revenue_to_date)
                * ((2 * abs(cast(revenue_to_date.revenue_to_date * 100 as hugeint)) + grid.cohort_size)
                    // (2 * grid.cohort_size))
                as decimal(18, 0)
            ) * cast(0.01 as decimal(3, 2))
            as decimal(18, 2)
        ) as lifetime_value
    from grid
    left join still_members using (cohort_month, storecode, month)
    inner join revenue_to_date using (cohort_month, storecode, month)
    left join stores using (storecode)

)

select * from final
