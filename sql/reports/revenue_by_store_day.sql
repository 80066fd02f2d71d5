-- Revenue over the whole history the warehouse holds, each transaction in its newest fetched
-- version: voided transactions are not revenue. transactions counts distinct receipts; amount
-- is before tax. The store is the transaction's storecode, the date its local date.
-- Rebuilt whole by every build (a late void changes any day); it reads marts.sales_lines only.

with sales_lines as (

    select * from {{ ref('sales_lines') }}

),

final as (

    select
        storecode,
        business_date,
        type,
        count(distinct receipt_number) as transactions,
        cast(coalesce(sum(quantity), 0) as bigint) as quantity,
        cast(coalesce(sum(amount), 0) as decimal(38, 2)) as amount,
        cast(coalesce(sum(tax), 0) as decimal(38, 2)) as tax
    from sales_lines
    where not is_voided
    group by storecode, business_date, type

)

select * from final
