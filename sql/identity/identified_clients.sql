-- Who each surrogate key is: the newest identity version of every client still known (the
-- identified tier only). A view over the landed identity files, never stored in a part: a
-- forgotten client has no row once `membersync forget` has rewritten those files, and their key
-- stays in every other table, linked to no one.
{{ config(materialized='scratch_view') }}

with versions as (

    select * from {{ ref('stg_client_identity') }}

),

newest as (

    -- a version with the client's details wins over a link row (key and number only)
    select * from versions
    qualify row_number() over (
        partition by client_key
        order by identity_digest is not null desc, snapshot_date desc
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
        snapshot_date as identity_since
    from newest

)

select * from final
