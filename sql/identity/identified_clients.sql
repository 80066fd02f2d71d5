-- Who each surrogate key is: the newest identity version of every client still known (the
-- identified tier only). A forgotten client has no row: their key stays in every other table,
-- linked to no one (`membersync forget` rewrites this model's part without them).
-- Incremental: tonight's versions against the published table (source prior).

with versions as (

    select * exclude (snapshot_date), snapshot_date as identity_since
    from {{ ref('stg_client_identity') }}
    {% if incremental_build() %}
    union all by name
    select * exclude (client_name) from {{ source('prior', 'identity_clients') }}
    {% endif %}

),

newest as (

    -- a version with the client's details wins over a link row (key and number only)
    select * from versions
    qualify row_number() over (
        partition by client_key
        order by identity_digest is not null desc, identity_since desc
    ) = 1

),

final as (

    select
        client_key,
        client_number,
        trim(concat_ws(' ', first_name, last_name)) as client_name,
        first_name,
        last_name,
        email,
        phone,
        birth_date,
        gender,
        address1,
        city,
        state,
        postal_code,
        extra,
        identity_digest,
        identity_since
    from newest

)

select * from final
