-- Each client's debt at each store as of each night, with when it began: the committed night
-- the client's balance there was last <= 0 (no ledger row counts as 0). A debt owed on every
-- night the warehouse held when it was built is dated from the day before its first night (a
-- lower bound). Stored per night, so the age of a debt outlives the nights retention removes.
-- Incremental: a debt owed the night before the first night built carries its start from the
-- published table (source prior: that night's rows).

with all_nights as (

    select snapshot_date, lag(snapshot_date) over (order by snapshot_date) as previous_night
    from {{ source('meta', 'nights') }}

),

nights_built as (

    select
        all_nights.*,
        row_number() over (order by all_nights.snapshot_date) as night_index
    from all_nights
    inner join {{ source('meta', 'build_nights') }} using (snapshot_date)

),

owing as (

    select
        ledgers.as_of_date,
        ledgers.client_key,
        ledgers.storecode,
        ledgers.balance,
        nights_built.night_index
    from {{ ref('ledger_balances_daily') }} as ledgers
    inner join nights_built on nights_built.snapshot_date = ledgers.as_of_date
    where ledgers.balance > 0

),

numbered as (

    -- consecutive nights with a positive balance share a run (the same index minus row number)
    select
        *,
        night_index - row_number() over (partition by client_key, storecode order by night_index) as run_id
    from owing

),

runs as (

    select *, min(night_index) over (partition by client_key, storecode, run_id) as run_start_index
    from numbered

),

{% if incremental_build() %}
carried as (

    select client_key, storecode, debt_since from {{ source('prior', 'debts_daily') }}

),
{% endif %}

final as (

    select
        runs.as_of_date,
        runs.client_key,
        runs.storecode,
        runs.balance,
        coalesce(
            {% if incremental_build() %}
            case when runs.run_start_index = 1 then carried.debt_since end,
            {% endif %}
            run_start.previous_night,
            (select min(snapshot_date) from all_nights) - 1
        ) as debt_since
    from runs
    inner join nights_built as run_start on run_start.night_index = runs.run_start_index
    {% if incremental_build() %}
    left join carried using (client_key, storecode)
    {% endif %}

)

select * from final
