-- Client packages as of each night (the rows of each client's snapshot): a package's sessions
-- remaining and expiration as the client's newest sync before the night showed them. A package
-- shared with other clients is listed under each of them too (shared_from_client_key: its owner).
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
    select * exclude (as_of_date) from {{ source('prior', 'client_packages_daily') }}
    {% endif %}

),

final as (

    select
        snapshots.as_of_date,
        packages.client_key,
        packages.client_package_id,
        packages.package_id,
        packages.storecode,
        packages.purchase_date,
        packages.expiration_date,
        packages.sessions_total,
        packages.sessions_remaining,
        packages.shared_from_client_key,
        snapshots.snapshot_date
    from snapshots
    inner join packages using (client_key, snapshot_date)

)

select * from final
