-- What the analyst tier may know of a person, landed beside the identity (birth year, the
-- postal code's first characters), in versions like the identity's. A view, never stored as
-- parts: `membersync forget` rewrites its landed files with the identity's.
{{ config(materialized='scratch_view') }}

with landed as (

    select * from {{ source('landing', 'client_demographics') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, client_key
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        birth_year,
        postal_prefix
    from deduplicated

)

select * from final
