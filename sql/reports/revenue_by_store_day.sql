-- Revenue over the whole history the warehouse holds, each transaction in its newest fetched
-- version: voided transactions are not revenue. transactions counts distinct receipts; amount
-- is before tax. The store is the transaction's storecode, the date its local date.
-- Incremental, O(what changed): a late void changes any day, so the receipts whose lines were
-- built tonight are taken out of the published figures as they were (all their stored lines)
-- and put back as they are now. A receipt counts once in the one (store, day) of its
-- transaction, per line type, so its share of `transactions` is exact to add and subtract;
-- sums are exact DECIMAL. A group left with no receipt is gone, as in a full refresh.

with sales_lines as (

    select * from {{ ref('sales_lines') }}

),

{%- if incremental_build() %}

touched_receipts as (

    select distinct receipt_number from sales_lines

),

lines_as_published as (

    {{ current_versions('sales_lines', 'receipt_number, line_no', 'touched_receipts', 'receipt_number') }}

),

lines_now as (

    select * from sales_lines
    union all by name
    select lines_as_published.*
    from lines_as_published
    anti join sales_lines using (receipt_number, line_no)

),

{%- endif %}


{%- if incremental_build() %}

changes as (

    select * from {{ source('prior', 'revenue_by_store_day') }}
    union all by name
    {{ revenue_of('lines_as_published', '-') }}
    union all by name
    {{ revenue_of('lines_now', '') }}

),

revenue as (

    select
        storecode,
        business_date,
        type,
        cast(sum(transactions) as bigint) as transactions,
        cast(sum(quantity) as bigint) as quantity,
        cast(sum(amount) as decimal(38, 2)) as amount,
        cast(sum(tax) as decimal(38, 2)) as tax
    from changes
    group by storecode, business_date, type
    having sum(transactions) > 0

),

{%- else %}

revenue as (

    {{ revenue_of('sales_lines', '') }}

),

{%- endif %}

final as (

    select * from revenue

)

select * from final
