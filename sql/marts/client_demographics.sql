-- What the analyst tier may know of each client still known: birth year and the postal code's
-- first characters, in their newest version. Personal: `membersync forget` rewrites this
-- model's part without the forgotten clients. Incremental: tonight's versions against the
-- published table (source prior).

with versions as (

    select client_key, birth_year, postal_prefix, snapshot_date as since
    from {{ ref('stg_client_demographics') }}
    {% if incremental_build() %}
    union all by name
    select * from {{ source('prior', 'client_demographics') }}
    {% endif %}

),

final as (

    select client_key, birth_year, postal_prefix, since
    from versions
    qualify row_number() over (partition by client_key order by since desc) = 1

)

select * from final
