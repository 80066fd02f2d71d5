-- How the package liability moved at each store from the previous committed night to this one:
-- closing_liability = opening_liability + sold - redeemed - expired, per row (a dbt test).
-- Each package is followed by (client_package_id, client_key) between the two nights, at its
-- liability of each night (marts.client_packages_daily; 0 when not open):
-- - sold: a package owed tonight and not last night (bought; or sessions added to a used-up one);
-- - expired: a package owed last night whose expiration date has passed tonight (breakage);
-- - redeemed: any other fall in what a package is owed (sessions used; a package that left the
--   client's list); a rise of a package owed on both nights (a dearer list price) counts as sold.
-- The first night the warehouse holds is the baseline: opening = closing, no movement.
-- Rows: the night's store list, and any other storecode a package names on either night (store_name
-- empty), so consecutive rows chain. Incremental: the previous night comes from source prior.

with nights_built as (

    select snapshot_date from {{ source('meta', 'build_nights') }}

),

stores as (

    select * from {{ ref('stg_stores') }}

),

packages as (

    select as_of_date as snapshot_date, client_key, client_package_id, storecode, expiration_date, liability
    from {{ ref('client_packages_daily') }}
    where is_open
    {% if incremental_build() %}
    union all
    select as_of_date, client_key, client_package_id, storecode, expiration_date, liability
    from {{ source('prior', 'client_packages_daily') }}
    where is_open
    {% endif %}

),

night_pairs as (

    {{ night_pairs() }}

),

tonight as (

    select packages.* from packages inner join nights_built using (snapshot_date)

),

last_night as (

    select night_pairs.snapshot_date, packages.* exclude (snapshot_date)
    from night_pairs
    inner join packages on packages.snapshot_date = night_pairs.previous_night

),

movements as (

    select
        coalesce(tonight.snapshot_date, last_night.snapshot_date) as snapshot_date,
        coalesce(tonight.storecode, last_night.storecode) as storecode,
        coalesce(last_night.liability, 0) as opening,
        coalesce(tonight.liability, 0) as closing,
        tonight.liability is null
            and last_night.expiration_date < last_night.snapshot_date as has_expired
    from tonight
    full outer join last_night
        on last_night.snapshot_date = tonight.snapshot_date
        and last_night.client_key = tonight.client_key
        and last_night.client_package_id = tonight.client_package_id
        and last_night.storecode = tonight.storecode

),

by_store as (

    select
        snapshot_date,
        storecode,
        sum(opening) as opening_liability,
        sum(greatest(closing - opening, 0)) as sold,
        sum(greatest(opening - closing, 0)) filter (where not has_expired) as redeemed,
        sum(opening) filter (where has_expired) as expired,
        sum(closing) as closing_liability
    from movements
    group by all

),

row_keys as (

    select snapshot_date, storecode from stores
    union
    select snapshot_date, storecode from by_store

),

final as (

    select
        row_keys.snapshot_date,
        row_keys.storecode,
        stores.name as store_name,
        cast(coalesce(by_store.opening_liability, 0) as decimal(18, 2)) as opening_liability,
        cast(coalesce(by_store.sold, 0) as decimal(18, 2)) as sold,
        cast(coalesce(by_store.redeemed, 0) as decimal(18, 2)) as redeemed,
        cast(coalesce(by_store.expired, 0) as decimal(18, 2)) as expired,
        cast(coalesce(by_store.closing_liability, 0) as decimal(18, 2)) as closing_liability
    from row_keys
    left join stores using (snapshot_date, storecode)
    left join by_store using (snapshot_date, storecode)

)

select * from final
