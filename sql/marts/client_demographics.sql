-- What the analyst tier may know of each client still known: birth year and the postal code's
-- first characters, in their newest version. A view over the landed demographics files, never
-- stored in a part: `membersync forget` rewrites those files.
{{ config(materialized='scratch_view') }}

with versions as (

    select client_key, birth_year, postal_prefix, snapshot_date as since
    from {{ ref('stg_client_demographics') }}

),

final as (

    select client_key, birth_year, postal_prefix, since
    from versions
    qualify row_number() over (partition by client_key order by since desc) = 1

)

select * from final
