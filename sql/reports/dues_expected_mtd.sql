-- The dues EFT memberships say should be billed, month to date, as of each night, per store of
-- the night's store list: the monthly dues of each EFT membership active on a night held that is
-- its draw day (the night's day of the month), summed over the month's nights up to this one.
-- Stored per night, so a month's figure outlives its daily nights: retention may thin a month to
-- its last night, and reports.dues_billing_by_store_month reads each month's newest night.
-- Incremental: the month to date of the night before the first night built comes from source
-- prior (its newest night).

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

    select stores.*, coalesce(due_tonight.due, 0) as due
    from stores
    left join due_tonight using (snapshot_date, storecode)

),

{% if incremental_build() %}
carried as (

    select month, storecode, expected_dues from {{ source('prior', 'dues_expected_mtd') }}

),
{% endif %}

running as (

    select
        cast(date_trunc('month', snapshot_date) as date) as month,
        storecode,
        snapshot_date as as_of_date,
        store_name,
        sum(due) over (
            partition by date_trunc('month', snapshot_date), storecode
            order by snapshot_date
            rows between unbounded preceding and current row
        ) as expected_dues
    from daily

),

final as (

    select
        running.month,
        running.storecode,
        running.as_of_date,
        running.store_name,
        {% if incremental_build() %}
        cast(running.expected_dues + coalesce(carried.expected_dues, 0) as decimal(18, 2)) as expected_dues
        {% else %}
        cast(running.expected_dues as decimal(18, 2)) as expected_dues
        {% endif %}
    from running
    {% if incremental_build() %}
    left join carried
        on carried.month = running.month and carried.storecode = running.storecode
    {% endif %}

)

select * from final
