-- Client packages as of each night (the rows of each client's snapshot): a package's sessions
-- remaining and expiration as the client's newest sync before the night showed them, and what it
-- is owed for that night. A package shared with other clients is listed under each of them too
-- (shared_from_client_key: its owner); only the owner's row is owed (is_open, liability).
-- Open: sessions remain and the expiration date is on or after the night, or there is none
-- (expiry is a date passing, not an update). Liability: sessions remaining at the night's package
-- list price per session (price / sessions), half-up to the cent, in integer cents; a package off
-- the night's list counts at no price (its price is unknown).
-- Incremental: older snapshots' rows come from the previous night's partition (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

packages_tonight as (

    select
        snapshot_date,
        client_key,
        client_package_id,
        package_id,
        storecode,
        purchase_date,
        expiration_date,
        sessions_total,
        sessions_remaining,
        shared_from_client_key
    from {{ ref('stg_client_packages') }}

),

packages as (

    select * from packages_tonight
    {% if incremental_build() %}
    union all by name
    select * exclude (as_of_date, is_open, liability) from {{ source('prior', 'client_packages_daily') }}
    {% endif %}

),

price_list as (

    select snapshot_date as as_of_date, package_id, price, sessions
    from {{ ref('stg_sellable_packages') }}

),

as_of_night as (

    select
        snapshots.as_of_date,
        packages.*,
        packages.shared_from_client_key is null
            and packages.sessions_remaining > 0
            and coalesce(packages.expiration_date >= snapshots.as_of_date, true) as is_open
    from snapshots
    inner join packages using (client_key, snapshot_date)

),

final as (

    select
        as_of_night.as_of_date,
        as_of_night.client_key,
        as_of_night.client_package_id,
        as_of_night.package_id,
        as_of_night.storecode,
        as_of_night.purchase_date,
        as_of_night.expiration_date,
        as_of_night.sessions_total,
        as_of_night.sessions_remaining,
        as_of_night.shared_from_client_key,
        as_of_night.is_open,
        cast(cast(case when as_of_night.is_open and price_list.sessions > 0 then
            (2 * as_of_night.sessions_remaining * cast(price_list.price * 100 as hugeint) + price_list.sessions)
            // (2 * price_list.sessions)
        else 0 end as decimal(38, 0)) * 0.01 as decimal(18, 2)) as liability,
        as_of_night.snapshot_date
    from as_of_night
    left join price_list using (as_of_date, package_id)

)

select * from final
