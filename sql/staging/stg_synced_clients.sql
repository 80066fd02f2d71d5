-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
with landed as (

    select * from {{ source('landing', 'synced_clients') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, client_key
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        home_store,
        last_modified,
        extra
    from deduplicated

)

select * from final
