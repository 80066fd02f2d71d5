-- The communication preferences of each client as of the newest committed night: the rows of the
-- client's snapshot. Incremental: a snapshot older than the nights being built is one the
-- previous build's table already holds (source prior).

with newest_snapshots as (

    select client_key, snapshot_date
    from {{ ref('client_snapshots') }}
    where as_of_date = (select max(snapshot_date) from {{ source('meta', 'nights') }})

),

rows_tonight as (

    select * exclude (extra) from {{ ref('stg_comm_prefs') }}

),

candidate_rows as (

    select * from rows_tonight
    {% if incremental_build() %}
    union all by name
    select * from {{ source('prior', 'current_comm_prefs') }}
    {% endif %}

),

final as (

    select candidate_rows.*
    from newest_snapshots
    inner join candidate_rows using (client_key, snapshot_date)

)

select * from final
