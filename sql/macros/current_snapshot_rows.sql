{#- A per-client list as of the newest committed night: the rows of each client's snapshot (a
    client synced on a night landed all its rows that night: marts.client_snapshots), from the
    staging model `staging` (without its extra). Incremental: a snapshot older than the nights
    being built is one the previous build's table `table` already holds (source prior). -#}
{% macro current_snapshot_rows(staging, table) %}
with newest_snapshots as (

    select client_key, snapshot_date
    from {{ ref('client_snapshots') }}
    where as_of_date = (select max(snapshot_date) from {{ source('meta', 'nights') }})

),

rows_tonight as (

    select * exclude (extra) from {{ ref(staging) }}

),

candidate_rows as (

    select * from rows_tonight
    {% if incremental_build() %}
    union all by name
    select * from {{ source('prior', table) }}
    {% endif %}

),

final as (

    select candidate_rows.*
    from newest_snapshots
    inner join candidate_rows using (client_key, snapshot_date)

)

select * from final
{% endmacro %}
