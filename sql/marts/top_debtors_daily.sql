-- The 50 largest positive balances per store of each night's store list, with every balance tied
-- with the 50th (equal balances share a rank), and what the report shows beside them as of the
-- night: active memberships and whether a billing account is on file (across stores). The
-- payment date is added by the view reports.top_debtors, from the events' newest versions; the
-- identified tier's identity.top_debtors breaks the ties by client number and keeps 50.

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
        ledgers.client_key,
        ledgers.balance,
        rank() over (
            partition by ledgers.as_of_date, ledgers.storecode
            order by ledgers.balance desc
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

    select as_of_date as snapshot_date, client_key, count(*) as active_memberships
    from {{ ref('memberships_daily') }}
    where status = 'active'
    group by all

),

eft_on_file as (

    select distinct as_of_date as snapshot_date, client_key
    from {{ ref('billing_accounts_daily') }}

),

final as (

    select
        top_balances.snapshot_date,
        top_balances.storecode,
        top_balances.client_key,
        top_balances.balance,
        coalesce(active_memberships.active_memberships, 0) as active_memberships,
        eft_on_file.client_key is not null as eft_on_file,
        top_balances.rank_at_store
    from top_balances
    left join active_memberships
        on active_memberships.snapshot_date = top_balances.snapshot_date
        and active_memberships.client_key = top_balances.client_key
    left join eft_on_file
        on eft_on_file.snapshot_date = top_balances.snapshot_date
        and eft_on_file.client_key = top_balances.client_key

)

select * from final
