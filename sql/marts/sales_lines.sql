-- Transaction lines with their transaction's store, local business date and voided flag. A line
-- whose transaction header did not land has a null storecode and business_date (the revenue
-- report's key tests then fail loudly rather than drop revenue silently).
-- snapshot_date: the night the line or its transaction last changed (storage latest: a build
-- stores the rows whose line or transaction changed in the nights it builds).

with lines as (

    select * from {{ ref('transaction_lines') }}

),

transactions as (

    select * from {{ ref('transactions') }}

),

final as (

    select
        greatest(lines.snapshot_date, transactions.snapshot_date) as snapshot_date,
        lines.receipt_number,
        lines.line_no,
        transactions.storecode,
        transactions.business_date,
        transactions.transaction_date,
        transactions.status as transaction_status,
        coalesce(transactions.is_voided, false) as is_voided,
        lines.client_number,
        lines.type,
        lines.type_raw,
        lines.product_number,
        lines.package_id,
        lines.membership_id,
        lines.gift_cert_no,
        lines.description,
        lines.quantity,
        lines.price_per_unit,
        lines.amount,
        lines.tax
    from lines
    left join transactions using (receipt_number)

)

select * from final
