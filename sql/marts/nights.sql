-- The nights the warehouse was built from, with what their manifests say.

with nights as (

    select * from {{ source('meta', 'nights') }}

),

final as (

    select
        snapshot_date,
        run_id,
        mode,
        committed_at,
        watermark,
        clients_synced
    from nights

)

select * from final
