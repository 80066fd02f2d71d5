-- When each client last did business with the chain, for retention's identity horizon
-- (MEMBERSYNC_RETENTION identity=...: a client inactive that long is forgotten). A client is
-- active now while they hold a membership that has not ended (active, frozen or on hold), a
-- ledger or points balance other than zero, or a package with sessions left that has not
-- expired; otherwise their last activity is the newest of their memberships' dates, their sales
-- (voided ones too: a till event), payments, points movements and the day they were created;
-- a client none of that dates counts from the night their record was last fetched changed (so
-- a record without dates is never "inactive since the year 1").
{{ config(materialized='scratch_view') }}

with newest_night as (

    select max(snapshot_date) as night from {{ source('meta', 'nights') }}

),

clients as (

    select client_key, created_date, snapshot_date from {{ ref('current_clients') }}

),

holding as (

    select client_key from {{ ref('current_memberships') }}
    where status in ('active', 'frozen', 'on_hold')
    union
    select client_key from {{ ref('current_ledger_balances') }} where balance <> 0
    union
    select client_key from {{ ref('current_points_balances') }} where points <> 0
    union
    select client_key from {{ ref('current_client_packages') }}
    where sessions_remaining > 0
        and (expiration_date is null or expiration_date >= (select night from newest_night))

),

dated as (

    select client_key, greatest(start_date, end_date, cancel_date, freeze_end_date) as day
    from {{ ref('current_memberships') }}
    union all
    select client_key, business_date from {{ ref('transactions') }}
    union all
    select client_key, cast(date as date) from {{ ref('transaction_payments') }}
    union all
    select client_key, cast(date as date) from {{ ref('points_transactions') }}
    union all
    select client_key, purchase_date from {{ ref('current_client_packages') }}
    union all
    select client_key, created_date from clients

),

last_dated as (

    select client_key, max(day) as last_activity_date from dated group by client_key

),

final as (

    select
        clients.client_key,
        holding.client_key is not null as active_now,
        coalesce(last_dated.last_activity_date, clients.snapshot_date) as last_activity_date
    from clients
    left join holding using (client_key)
    left join last_dated using (client_key)

)

select * from final
