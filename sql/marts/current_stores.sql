-- The newest committed night's store list (a view over staging.stores).
{{ config(materialized='scratch_view') }}

with newest_night as (

    select max(snapshot_date) as snapshot_date from {{ source('meta', 'nights') }}

),

stores as (

    select * from {{ ref('stg_stores') }}

),

final as (

    select stores.* exclude (extra)
    from stores
    where stores.snapshot_date = (select snapshot_date from newest_night)

)

select * from final
