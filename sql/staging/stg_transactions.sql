-- transaction_date is the store's local time (the landing zone converted any offset);
-- business_date is its local calendar day. Voided sales are not revenue.
with landed as (

    select * from {{ source('landing', 'transactions') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, receipt_number
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        receipt_number,
        transaction_date,
        cast(transaction_date as date) as business_date,
        storecode,
        emp_no,
        case lower(trim(status))
            when 'saved' then 'saved'
            when 'voided' then 'voided'
            else 'other'
        end as status,
        status as status_raw,
        coalesce(lower(trim(status)) = 'voided', false) as is_voided,
        extra
    from deduplicated

)

select * from final
