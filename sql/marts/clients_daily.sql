-- A client's details as of each night: the rows of the client's snapshot (marts.client_snapshots).
-- Incremental: a snapshot is either a night being built (staging) or an older one, whose rows the
-- previous night's partition of this mart already holds (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

details_tonight as (

    select
        snapshot_date,
        client_number,
        trim(concat_ws(' ', first_name, last_name)) as client_name,
        first_name,
        last_name,
        email,
        phone,
        birth_date,
        gender,
        city,
        state,
        postal_code,
        home_store,
        referred_by,
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
        details.client_number,
        details.client_name,
        details.first_name,
        details.last_name,
        details.email,
        details.phone,
        details.birth_date,
        details.gender,
        details.city,
        details.state,
        details.postal_code,
        details.home_store,
        details.referred_by,
        details.skin_type,
        details.created_date,
        details.last_modified,
        snapshots.snapshot_date
    from snapshots
    inner join details using (client_number, snapshot_date)

)

select * from final
