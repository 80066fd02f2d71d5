-- The 50 largest positive balances per store and night (marts.top_debtors_daily: ties at the 50th
-- included, no personal field; identity.top_debtors names them), with the
-- client's newest payment on a non-voided transaction at that store, on or before the night
-- (store-local date). A view: payments are read in their newest fetched version whenever the
-- report is read, so a late void is seen by every night, as the full build sees it.
{{ config(materialized='scratch_view') }}

with top_debtors as (

    select * from {{ ref('top_debtors_daily') }}

),

transactions as (

    select * from {{ ref('transactions') }}

),

payments as (

    select
        transaction_payments.client_key,
        transactions.storecode,
        cast(transaction_payments.date as date) as payment_date
    from {{ ref('transaction_payments') }} as transaction_payments
    inner join transactions using (receipt_number)
    where not transactions.is_voided and transaction_payments.date is not null

),

last_payment as (

    select
        top_debtors.snapshot_date,
        top_debtors.storecode,
        top_debtors.client_key,
        max(payments.payment_date) as last_payment_date
    from top_debtors
    inner join payments
        on payments.client_key = top_debtors.client_key
        and payments.storecode = top_debtors.storecode
        and payments.payment_date <= top_debtors.snapshot_date
    group by all

),

final as (

    select
        top_debtors.snapshot_date,
        top_debtors.storecode,
        top_debtors.client_key,
        top_debtors.balance,
        top_debtors.active_memberships,
        top_debtors.eft_on_file,
        last_payment.last_payment_date
    from top_debtors
    left join last_payment
        on last_payment.snapshot_date = top_debtors.snapshot_date
        and last_payment.storecode = top_debtors.storecode
        and last_payment.client_key = top_debtors.client_key

)

select * from final
