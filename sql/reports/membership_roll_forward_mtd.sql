-- reports.membership_roll_forward to date within its calendar month, as of each night: the
-- opening of the month's first night held, the movements of its nights up to this one, the
-- closing of this night. Stored per night, so a month's figures outlive its daily nights:
-- retention may thin a month to its last night, and reports.membership_roll_forward_monthly
-- reads each month's newest night.
-- Incremental: the month-to-date of the night before the first night built comes from source
-- prior (its newest night).

with daily as (

    select * from {{ ref('membership_roll_forward') }}

),

{% if incremental_build() %}
carried as (

    select month, storecode, first_night, nights, opening_active, new, reactivated, frozen, canceled, expired
    from {{ source('prior', 'membership_roll_forward_mtd') }}

),
{% endif %}

running as (

    select
        cast(date_trunc('month', snapshot_date) as date) as month,
        storecode,
        snapshot_date as as_of_date,
        store_name,
        min(snapshot_date) over to_date as first_night,
        count(*) over to_date as nights,
        first_value(opening_active) over to_date as opening_active,
        sum(new) over to_date as new,
        sum(reactivated) over to_date as reactivated,
        sum(frozen) over to_date as frozen,
        sum(canceled) over to_date as canceled,
        sum(expired) over to_date as expired,
        closing_active
    from daily
    window to_date as (
        partition by date_trunc('month', snapshot_date), storecode
        order by snapshot_date
        rows between unbounded preceding and current row
    )

),

final as (

    select
        running.month,
        running.storecode,
        running.as_of_date,
        running.store_name,
        {% if incremental_build() %}
        coalesce(carried.first_night, running.first_night) as first_night,
        running.nights + coalesce(carried.nights, 0) as nights,
        coalesce(carried.opening_active, running.opening_active) as opening_active,
        cast(running.new + coalesce(carried.new, 0) as bigint) as new,
        cast(running.reactivated + coalesce(carried.reactivated, 0) as bigint) as reactivated,
        cast(running.frozen + coalesce(carried.frozen, 0) as bigint) as frozen,
        cast(running.canceled + coalesce(carried.canceled, 0) as bigint) as canceled,
        cast(running.expired + coalesce(carried.expired, 0) as bigint) as expired,
        {% else %}
        running.first_night,
        running.nights,
        running.opening_active,
        cast(running.new as bigint) as new,
        cast(running.reactivated as bigint) as reactivated,
        cast(running.frozen as bigint) as frozen,
        cast(running.canceled as bigint) as canceled,
        cast(running.expired as bigint) as expired,
        {% endif %}
        running.closing_active
    from running
    {% if incremental_build() %}
    left join carried
        on carried.month = running.month and carried.storecode = running.storecode
    {% endif %}

)

select * from final
