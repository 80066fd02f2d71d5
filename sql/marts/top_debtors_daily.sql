-- The 50 largest positive balances per store of each night's store list (ties broken by
-- client_number), with what the report shows beside them as of the night: the client's name,
-- active memberships and whether a billing account is on file (across stores). The payment
-- date is added by the view reports.top_debtors, from the events' newest versions.

with ledgers as (

    select * from {{ ref('ledger_balances_daily') }}

),

stores as (

    select * from {{ ref('stg_stores') }}

),

ranked as (

    select
        ledgers.as_of_date as snapshot_date,
        ledgers.storecode,
        ledgers.client_number,
        ledgers.balance,
        row_number() over (
            partition by ledgers.as_of_date, ledgers.storecode
            order by ledgers.balance desc, ledgers.client_number
        ) as rank_at_store
    from ledgers
    inner join stores
        on stores.snapshot_date = ledgers.as_of_date and stores.storecode = ledgers.storecode
    where ledgers.balance > 0

),

top_balances as (

    select * from ranked where rank_at_store <= 50

),

active_memberships as (

    select as_of_date as snapshot_date, client_number, count(*) as active_memberships
    from {{ ref('memberships_daily') }}
    where status = 'active'
    group by all

),

eft_on_file as (

    select distinct as_of_date as snapshot_date, client_number
    from {{ ref('billing_accounts_daily') }}

),

clients as (

    select as_of_date as snapshot_date, client_number, client_name
    from {{ ref('clients_daily') }}

),

final as (

    select
        top_balances.snapshot_date,
        top_balances.storecode,
        top_balances.client_number,
        clients.client_name,
        top_balances.balance,
        coalesce(active_memberships.active_memberships, 0) as active_memberships,
        eft_on_file.client_number is not null as eft_on_file,
        top_balances.rank_at_store
    from top_balances
    left join clients
        on clients.snapshot_date = top_balances.snapshot_date
        and clients.client_number = top_balances.client_number
    left join active_memberships
        on active_memberships.snapshot_date = top_balances.snapshot_date
        and active_memberships.client_number = top_balances.client_number
    left join eft_on_file
        on eft_on_file.snapshot_date = top_balances.snapshot_date
        and eft_on_file.client_number = top_balances.client_number

)

select * from final
