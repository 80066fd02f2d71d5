-- Gift certificates sold and not yet redeemed, as of each night, per store of the night's store
-- list: sold is the amount of the gift-certificate lines (type G) of the store's saved sales up
-- to the night (local business date), redeemed the payments made with a payment type of kind
-- GIFT (the store's payment-type list, newest listing) on the store's saved sales up to the night
-- (local date); outstanding = sold - redeemed. A certificate sold at one store may be redeemed at
-- another, so a store's outstanding can be negative: the chain's is the TOTAL row.
-- A view: sales and payments are read in their newest fetched version whenever the report is
-- read, so a late void shows on every night, as a full build sees it (as reports.top_debtors).
{{ config(materialized='scratch_view') }}

with stores as (

    select snapshot_date, storecode, store_name from {{ ref('store_figures_daily') }}

),

transactions as (

    select * from {{ ref('transactions') }}

),

gift_payment_types as (

    -- codes compare case-insensitively (the contract's enumerations; a payment's paymentType too)
    select storecode, upper(trim(code)) as code
    from (
        select query_storecode as storecode, code, kind
        from {{ ref('stg_payment_types') }}
        qualify row_number() over (
            partition by query_storecode, upper(trim(code)) order by snapshot_date desc
        ) = 1
    )
    where upper(trim(kind)) = 'GIFT'

),

sold_by_day as (

    select storecode, business_date as day, sum(amount) as amount
    from {{ ref('sales_lines') }}
    where type = 'G' and not is_voided
    group by all

),

redeemed_by_day as (

    select transactions.storecode, cast(payments.date as date) as day, sum(payments.amount) as amount
    from {{ ref('transaction_payments') }} as payments
    inner join transactions using (receipt_number)
    inner join gift_payment_types
        on gift_payment_types.storecode = transactions.storecode
        and gift_payment_types.code = upper(trim(payments.payment_type))
    where not transactions.is_voided and payments.date is not null
    group by all

),

to_date as (

    -- running totals per store: each night takes the newest day on or before it (asof join)
    select
        'sold' as measure,
        storecode,
        day,
        sum(amount) over (partition by storecode order by day) as amount
    from sold_by_day
    union all
    select
        'redeemed',
        storecode,
        day,
        sum(amount) over (partition by storecode order by day)
    from redeemed_by_day

),

sold as (

    select stores.snapshot_date, stores.storecode, to_date.amount
    from stores
    asof inner join (select * from to_date where measure = 'sold') as to_date
        on to_date.storecode = stores.storecode and to_date.day <= stores.snapshot_date

),

redeemed as (

    select stores.snapshot_date, stores.storecode, to_date.amount
    from stores
    asof inner join (select * from to_date where measure = 'redeemed') as to_date
        on to_date.storecode = stores.storecode and to_date.day <= stores.snapshot_date

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.store_name,
        cast(coalesce(sold.amount, 0) as decimal(18, 2)) as sold,
        cast(coalesce(redeemed.amount, 0) as decimal(18, 2)) as redeemed,
        cast(coalesce(sold.amount, 0) - coalesce(redeemed.amount, 0) as decimal(18, 2)) as outstanding
    from stores
    left join sold using (snapshot_date, storecode)
    left join redeemed using (snapshot_date, storecode)

)

select * from final
