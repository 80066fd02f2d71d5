-- Transaction lines with their transaction's store, local business date and voided flag. A line
-- whose transaction header did not land has a null storecode and business_date (the revenue
-- report's key tests then fail loudly rather than drop revenue silently).
-- snapshot_date: the night the line or its transaction last changed (storage latest).
-- Incremental: the model holds the lines fetched in the nights being built and the lines of the
-- transactions fetched then, each joined with its transaction's current version; the build
-- stores the rows whose line or transaction changed in those nights.

with fetched_lines as (

    select * from {{ ref('transaction_lines') }}

),

fetched_transactions as (

    select * from {{ ref('transactions') }}

),

{%- if incremental_build() %}

lines_of_fetched_transactions as (

    select stored.*
    from ({{ current_versions('transaction_lines', 'receipt_number, line_no', 'fetched_transactions', 'receipt_number') }}) as stored
    anti join fetched_lines using (receipt_number, line_no)

),

lines as (

    select * from fetched_lines
    union all by name
    select * from lines_of_fetched_transactions

),

transactions_of_fetched_lines as (

    select stored.*
    from ({{ current_versions('transactions', 'receipt_number', 'lines', 'receipt_number') }}) as stored
    anti join fetched_transactions using (receipt_number)

),

transactions as (

    select * from fetched_transactions
    union all by name
    select * from transactions_of_fetched_lines

),

{%- else %}

lines as (

    select * from fetched_lines

),

transactions as (

    select * from fetched_transactions

),

{%- endif %}

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
        lines.client_key,
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
