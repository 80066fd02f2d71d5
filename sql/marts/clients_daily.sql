-- A client's details as of each night: the rows of the client's snapshot (marts.client_snapshots).
-- No personal field: those are in the identified tier only (identity.clients).
-- Incremental: a snapshot is either a night being built (staging) or an older one, whose rows the
-- previous night's partition of this mart already holds (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

details_tonight as (

    select
        snapshot_date,
        client_key,
        home_store,
        referred_by_key,
        skin_type,
        created_date,
        last_modified
    from {{ ref('stg_clients') }}

),

details as (

    select * from details_tonight
    {% if incremental_build() %}
    union all by name
    select * exclude (as_of_date) from {{ source('prior', 'clients_daily') }}
    {% endif %}

),

final as (

    select
        snapshots.as_of_date,
        details.client_key,
        details.home_store,
        details.referred_by_key,
        details.skin_type,
        details.created_date,
        details.last_modified,
        snapshots.snapshot_date
    from snapshots
    inner join details using (client_key, snapshot_date)

)

select * from final
