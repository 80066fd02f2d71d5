-- Which snapshot holds a client's current state as of each night: the newest night <= as_of_date
-- on which the client was synced (staging.synced_clients). A client synced on a night landed its
-- whole state that night, so every "daily" mart takes ALL of a client's rows from this one
-- snapshot: a ledger row that vanished is not resurrected from an older night, and a client not
-- changed tonight still counts with its last state.
-- Incremental: the nights being built continue the previous night's map (source prior).

with nights_built as (

    select snapshot_date from {{ source('meta', 'build_nights') }}

),

synced_tonight as (

    select client_key, snapshot_date from {{ ref('stg_synced_clients') }}

),

{% if incremental_build() %}
synced_before as (

    -- each client's snapshot as of the newest night already built
    select client_key, snapshot_date from {{ source('prior', 'client_snapshots') }}

),
{% endif %}

syncs as (

    select client_key, snapshot_date from synced_tonight
    {% if incremental_build() %}
    union all
    select client_key, snapshot_date from synced_before
    {% endif %}

),

sync_spans as (

    select
        client_key,
        snapshot_date,
        lead(snapshot_date) over (partition by client_key order by snapshot_date) as next_snapshot_date
    from syncs

),

final as (

    select
        nights_built.snapshot_date as as_of_date,
        sync_spans.client_key,
        sync_spans.snapshot_date
    from nights_built
    inner join sync_spans
        on nights_built.snapshot_date >= sync_spans.snapshot_date
        and (sync_spans.next_snapshot_date is null or nights_built.snapshot_date < sync_spans.next_snapshot_date)

)

select * from final
