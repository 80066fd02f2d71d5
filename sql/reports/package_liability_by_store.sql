-- Sessions sold in packages and not yet used, as of each night, per store of the night's store
-- list. A client package is open on a night when it has sessions remaining and its expiration
-- date is on or after the night, or it has none (expiry is a date passing: no change on the vendor's side). Its
-- liability is its sessions remaining at the package list's price per session (the night's list
-- price divided by its sessions), rounded half-up to the cent per package; the store's liability
-- is the sum of its packages'. A package no longer on the night's package list counts its
-- sessions at no price (its price is unknown). The store is the client package's storecode; a
-- package shared with other clients counts once, at its owner's row.

with stores as (

    select * from {{ ref('stg_stores') }}

),

packages as (

    select * from {{ ref('client_packages_daily') }}

),

price_list as (

    select snapshot_date, package_id, price, sessions
    from {{ ref('stg_sellable_packages') }}

),

open_packages as (

    select
        packages.as_of_date as snapshot_date,
        packages.storecode,
        packages.sessions_remaining,
        -- exact: integer cents, half-up (sessions remaining x price / sessions)
        case when price_list.sessions > 0 then
            (2 * packages.sessions_remaining * cast(price_list.price * 100 as hugeint) + price_list.sessions)
            // (2 * price_list.sessions)
        else 0 end as liability_cents
    from packages
    left join price_list
        on price_list.snapshot_date = packages.as_of_date
        and price_list.package_id = packages.package_id
    where packages.shared_from_client_key is null  -- a shared package counts once, at its owner
        and packages.sessions_remaining > 0
        and coalesce(packages.expiration_date >= packages.as_of_date, true)  -- no date: no expiry

),

by_store as (

    select
        snapshot_date,
        storecode,
        count(*) as open_packages,
        sum(sessions_remaining) as sessions_remaining,
        sum(liability_cents) as liability_cents
    from open_packages
    group by snapshot_date, storecode

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(by_store.open_packages, 0) as open_packages,
        cast(coalesce(by_store.sessions_remaining, 0) as bigint) as sessions_remaining,
        cast(cast(coalesce(by_store.liability_cents, 0) as decimal(38, 0)) * 0.01 as decimal(18, 2)) as liability
    from stores
    left join by_store using (snapshot_date, storecode)

)

select * from final
