-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
with landed as (

    select * from {{ source('landing', 'billing_accounts') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, billing_account_id
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        billing_account_id,
        membership_id,
        type,
        deduct_type,
        last_four,
        exp_month,
        exp_year,
        extra
    from deduplicated

)

select * from final
