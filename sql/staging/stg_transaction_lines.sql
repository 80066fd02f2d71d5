-- Line types compare case-insensitively (upper-cased); a type outside the contract's list is
-- 'other', the vendor's spelling stays in type_raw. amount is before tax.
with landed as (

    select * from {{ source('landing', 'transaction_lines') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, receipt_number, line_no
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        receipt_number,
        line_no,
        case upper(trim(type))
            when 'R' then 'R'
            when 'P' then 'P'
            when 'M' then 'M'
            when '1' then '1'
            when 'G' then 'G'
            else 'other'
        end as type,
        type as type_raw,
        product_number,
        package_id,
        membership_id,
        gift_cert_no,
        description,
        quantity,
        price_per_unit,
        amount,
        tax,
        extra
    from deduplicated

)

select * from final
