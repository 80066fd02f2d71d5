-- Ledger balances as of each night (each client's newest snapshot), per store of the night's
-- store list: positive = owed by the client, negative = credit. Money is exact DECIMAL:
-- amount_owed - credit_amount = net_balance.

with stores as (

    select * from {{ ref('stg_stores') }}

),

ledgers as (

    select * from {{ ref('ledger_balances_daily') }}

),

by_store as (

    select
        as_of_date as snapshot_date,
        storecode,
        count(*) filter (where balance > 0) as clients_owing,
        sum(balance) filter (where balance > 0) as amount_owed,
        count(*) filter (where balance < 0) as clients_in_credit,
        -sum(balance) filter (where balance < 0) as credit_amount,
        sum(balance) as net_balance
    from ledgers
    group by as_of_date, storecode

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(by_store.clients_owing, 0) as clients_owing,
        cast(coalesce(by_store.amount_owed, 0) as decimal(38, 2)) as amount_owed,
        coalesce(by_store.clients_in_credit, 0) as clients_in_credit,
        cast(coalesce(by_store.credit_amount, 0) as decimal(38, 2)) as credit_amount,
        cast(coalesce(by_store.net_balance, 0) as decimal(38, 2)) as net_balance
    from stores
    left join by_store using (snapshot_date, storecode)

)

select * from final
