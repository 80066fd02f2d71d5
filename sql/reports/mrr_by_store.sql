-- Monthly recurring revenue at each store and night: the monthly dues of active EFT memberships,
-- and how it moved since the previous committed night:
-- mrr = previous_mrr + new + reactivated + expansion - contraction - churned - paused, per row.
-- A membership is followed by (membership_id, storecode), as in membership_roll_forward; the
-- first night the warehouse holds is the baseline (previous_mrr = mrr, no movement). Rows: the
-- night's store list and any other storecode a membership names that night or the night before.
-- Incremental: the previous night of the first night built comes from source prior.

with nights_built as (

    select snapshot_date from {{ source('meta', 'build_nights') }}

),

stores as (

    select * from {{ ref('stg_stores') }}

),

memberships_built as (

    select
        as_of_date as snapshot_date,
        membership_id,
        storecode,
        status,
        status = 'active' and coalesce(is_eft, false) as in_mrr,
        coalesce(monthly_dues, 0) as monthly_dues
    from {{ ref('memberships_daily') }}
    where storecode is not null

),

memberships as (

    select * from memberships_built
    {% if incremental_build() %}
    union all
    select
        as_of_date as snapshot_date,
        membership_id,
        storecode,
        status,
        status = 'active' and coalesce(is_eft, false) as in_mrr,
        coalesce(monthly_dues, 0) as monthly_dues
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

    select night_pairs.snapshot_date, memberships.* exclude (snapshot_date)
    from night_pairs
    inner join memberships on memberships.snapshot_date = night_pairs.previous_night

),

transitions as (

    select
        coalesce(tonight.snapshot_date, last_night.snapshot_date) as snapshot_date,
        coalesce(tonight.storecode, last_night.storecode) as storecode,
        last_night.membership_id is not null as was_listed,
        coalesce(last_night.in_mrr, false) as was_in,
        coalesce(tonight.in_mrr, false) as is_in,
        tonight.status,
        coalesce(last_night.monthly_dues, 0) as previous_dues,
        coalesce(tonight.monthly_dues, 0) as dues
    from tonight
    full outer join last_night
        on last_night.snapshot_date = tonight.snapshot_date
        and last_night.membership_id = tonight.membership_id
        and last_night.storecode = tonight.storecode

),

by_store as (

    select
        snapshot_date,
        storecode,
        sum(previous_dues) filter (where was_in) as previous_mrr,
        sum(dues) filter (where is_in and not was_listed) as new,
        sum(dues) filter (where is_in and was_listed and not was_in) as reactivated,
        sum(dues - previous_dues) filter (where is_in and was_in and dues > previous_dues) as expansion,
        sum(previous_dues - dues) filter (where is_in and was_in and dues < previous_dues) as contraction,
        sum(previous_dues) filter (
            where was_in and not is_in and status is distinct from 'frozen' and status is distinct from 'on_hold'
        ) as churned,
        sum(previous_dues) filter (where was_in and status in ('frozen', 'on_hold')) as paused,
        sum(dues) filter (where is_in) as mrr
    from transitions
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
        cast(coalesce(by_store.previous_mrr, 0) as decimal(38, 2)) as previous_mrr,
        cast(coalesce(by_store.new, 0) as decimal(38, 2)) as new,
        cast(coalesce(by_store.reactivated, 0) as decimal(38, 2)) as reactivated,
        cast(coalesce(by_store.expansion, 0) as decimal(38, 2)) as expansion,
        cast(coalesce(by_store.contraction, 0) as decimal(38, 2)) as contraction,
        cast(coalesce(by_store.churned, 0) as decimal(38, 2)) as churned,
        cast(coalesce(by_store.paused, 0) as decimal(38, 2)) as paused,
        cast(coalesce(by_store.mrr, 0) as decimal(38, 2)) as mrr
    from row_keys
    left join stores using (snapshot_date, storecode)
    left join by_store using (snapshot_date, storecode)

)

select * from final
