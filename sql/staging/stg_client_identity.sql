-- Identity versions (the identified tier): a client's personal fields and number, landed on a
-- night the client was new or their identity changed, and link rows (key and number only) of
-- clients first known from a reference. A view, never stored as parts: the identified catalog
-- reads the landed identity files, and `membersync forget` rewrites only those.
{{ config(materialized='scratch_view') }}

with landed as (

    select * from {{ source('landing', 'client_identity') }}

),

deduplicated as (

    -- one row per client and night: the client's details before a link row, then the last written
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, client_key
        order by identity_digest is not null desc, _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        client_number,
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
        identity_digest,
        extra
    from deduplicated

)

select * from final
