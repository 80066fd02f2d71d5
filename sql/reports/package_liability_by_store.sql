-- Sessions sold in packages and not yet used, as of each night, per store of the night's store
-- list: the open packages of marts.client_packages_daily (which says what open and owed mean) at
-- the client package's storecode; a shared package counts once, at its owner's row.

with stores as (

    select * from {{ ref('stg_stores') }}

),

open_packages as (

    select * from {{ ref('client_packages_daily') }}
    where is_open

),

by_store as (

    select
        as_of_date as snapshot_date,
        storecode,
        count(*) as open_packages,
        sum(sessions_remaining) as sessions_remaining,
        sum(liability) as liability
    from open_packages
    group by all

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(by_store.open_packages, 0) as open_packages,
        cast(coalesce(by_store.sessions_remaining, 0) as bigint) as sessions_remaining,
        cast(coalesce(by_store.liability, 0) as decimal(18, 2)) as liability
    from stores
    left join by_store using (snapshot_date, storecode)

)

select * from final
