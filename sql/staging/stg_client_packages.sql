-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
with landed as (

    select * from {{ source('landing', 'client_packages') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, client_key, client_package_id
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        client_package_id,
        package_id,
        name,
        storecode,
        purchase_date,
        expiration_date,
        sessions_total,
        sessions_remaining,
        shared_from_client_key,
        extra
    from deduplicated

)

select * from final
