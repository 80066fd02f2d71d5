-- Memberships as of each night (the rows of each client's snapshot), statuses normalised.
-- Incremental: older snapshots' rows come from the previous night's partition (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

memberships_tonight as (

    select
        snapshot_date,
        client_key,
        membership_id,
        membership_type_id,
        name,
        is_eft,
        status,
        status_raw,
        storecode,
        start_date,
        end_date,
        draw_day,
        monthly_dues,
        price,
        freeze_start_date,
        freeze_end_date,
        cancel_date,
        last_modified
    from {{ ref('stg_memberships') }}

),

memberships as (

    select * from memberships_tonight
    {% if incremental_build() %}
    union all by name
    select * exclude (as_of_date) from {{ source('prior', 'memberships_daily') }}
    {% endif %}

),

final as (

    select
        snapshots.as_of_date,
        memberships.client_key,
        memberships.membership_id,
        memberships.membership_type_id,
        memberships.name,
        memberships.is_eft,
        memberships.status,
        memberships.status_raw,
        memberships.storecode,
        memberships.start_date,
        memberships.end_date,
        memberships.draw_day,
        memberships.monthly_dues,
        memberships.price,
        memberships.freeze_start_date,
        memberships.freeze_end_date,
        memberships.cancel_date,
        memberships.last_modified,
        snapshots.snapshot_date
    from snapshots
    inner join memberships using (client_key, snapshot_date)

)

select * from final
