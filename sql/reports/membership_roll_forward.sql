-- How active membership moved at each store from the previous committed night to this one:
-- closing_active = opening_active + new + reactivated - frozen - canceled - expired, per row.
-- A membership is followed by (membership_id, storecode): one that moves to another store ends at
-- the old store (expired) and is new at the new one. The first night the warehouse holds is the
-- baseline: opening_active = closing_active and no movement (there is no night before it).
-- Rows: the night's store list, and any other storecode a membership names that night or the
-- night before (store_name empty), so consecutive rows chain (a night's opening is the closing
-- of the night before) and the monthly twin adds up.
-- Incremental: the previous night of the first night built comes from source prior.

with nights_built as (

    select snapshot_date from {{ source('meta', 'build_nights') }}

),

stores as (

    select * from {{ ref('stg_stores') }}

),

memberships_built as (

    select as_of_date as snapshot_date, membership_id, storecode, status
    from {{ ref('memberships_daily') }}
    where storecode is not null

),

memberships as (

    select * from memberships_built
    {% if incremental_build() %}
    union all
    select as_of_date as snapshot_date, membership_id, storecode, status
    from {{ source('prior', 'memberships_daily') }}
    where storecode is not null
    {% endif %}

),

night_pairs as (

    {{ night_pairs() }}

),

tonight as (

    select memberships.*
    from memberships
    inner join nights_built using (snapshot_date)

),

last_night as (

    select night_pairs.snapshot_date, memberships.membership_id, memberships.storecode, memberships.status
    from night_pairs
    inner join memberships on memberships.snapshot_date = night_pairs.previous_night

),

transitions as (

    select
        coalesce(tonight.snapshot_date, last_night.snapshot_date) as snapshot_date,
        coalesce(tonight.storecode, last_night.storecode) as storecode,
        last_night.status as previous_status,
        tonight.status
    from tonight
    full outer join last_night
        on last_night.snapshot_date = tonight.snapshot_date
        and last_night.membership_id = tonight.membership_id
        and last_night.storecode = tonight.storecode

),

classified as (

    select
        snapshot_date,
        storecode,
        previous_status = 'active' as was_active,
        status = 'active' as is_active,
        case
            when status = 'active' and previous_status is null then 'new'
            when status = 'active' and previous_status <> 'active' then 'reactivated'
            when previous_status = 'active' and status in ('frozen', 'on_hold') then 'frozen'
            when previous_status = 'active' and status = 'canceled' then 'canceled'
            when previous_status = 'active' and status is distinct from 'active' then 'expired'
        end as movement
    from transitions

),

by_store as (

    select
        snapshot_date,
        storecode,
        count(*) filter (where was_active) as opening_active,
        count(*) filter (where movement = 'new') as new,
        count(*) filter (where movement = 'reactivated') as reactivated,
        count(*) filter (where movement = 'frozen') as frozen,
        count(*) filter (where movement = 'canceled') as canceled,
        count(*) filter (where movement = 'expired') as expired,
        count(*) filter (where is_active) as closing_active
    from classified
    group by snapshot_date, storecode

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
        coalesce(by_store.opening_active, 0) as opening_active,
        coalesce(by_store.new, 0) as new,
        coalesce(by_store.reactivated, 0) as reactivated,
        coalesce(by_store.frozen, 0) as frozen,
        coalesce(by_store.canceled, 0) as canceled,
        coalesce(by_store.expired, 0) as expired,
        coalesce(by_store.closing_active, 0) as closing_active
    from row_keys
    left join stores using (snapshot_date, storecode)
    left join by_store using (snapshot_date, storecode)

)

select * from final
