-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
with landed as (

    select * from {{ source('landing', 'ledger_balances') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, client_key, storecode
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        storecode,
        balance,
        as_of,
        extra
    from deduplicated

)

select * from final
