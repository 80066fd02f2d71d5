-- Loyalty points balances as of each night (the rows of each client's snapshot).
-- Incremental: older snapshots' rows come from the previous night's partition (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

points_tonight as (

    select snapshot_date, client_key, storecode, points
    from {{ ref('stg_points_balances') }}

),

points as (

    select * from points_tonight
    {% if incremental_build() %}
    union all by name
    select * exclude (as_of_date) from {{ source('prior', 'points_balances_daily') }}
    {% endif %}

),

final as (

    select
        snapshots.as_of_date,
        points.client_key,
        points.storecode,
        points.points,
        snapshots.snapshot_date
    from snapshots
    inner join points using (client_key, snapshot_date)

)

select * from final
