-- The ledger balances as of the newest committed night (a view: it reads the newest night of
-- marts.ledger_balances_daily).
{{ config(materialized='scratch_view') }}

with newest_night as (

    select max(snapshot_date) as snapshot_date from {{ source('meta', 'nights') }}

),

daily as (

    select * from {{ ref('ledger_balances_daily') }}

),

final as (

    select daily.* exclude (as_of_date)
    from daily
    where daily.as_of_date = (select snapshot_date from newest_night)

)

select * from final
