-- Ledger balances as of each night (the rows of each client's snapshot): balance > 0 is owed by
-- the client, < 0 is credit. Exact DECIMAL(18, 2).
-- Incremental: older snapshots' rows come from the previous night's partition (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

ledgers_tonight as (

    select snapshot_date, client_key, storecode, balance, as_of
    from {{ ref('stg_ledger_balances') }}

),

ledgers as (

    select * from ledgers_tonight
    {% if incremental_build() %}
    union all by name
    select * exclude (as_of_date) from {{ source('prior', 'ledger_balances_daily') }}
    {% endif %}

),

final as (

    select
        snapshots.as_of_date,
        ledgers.client_key,
        ledgers.storecode,
        ledgers.balance,
        ledgers.as_of,
        snapshots.snapshot_date
    from snapshots
    inner join ledgers using (client_key, snapshot_date)

)

select * from final
