-- The trend the vendor cannot show: memberships by status, night after night, at the
-- membership's own storecode; all six statuses, zeros included.

with stores as (

    select * from {{ ref('stg_stores') }}

),

memberships as (

    select * from {{ ref('memberships_daily') }}

),

statuses (status, status_order) as (

    values ('active', 1), ('frozen', 2), ('on_hold', 3), ('canceled', 4), ('expired', 5), ('other', 6)

),

by_status as (

    select as_of_date as snapshot_date, storecode, status, count(*) as memberships
    from memberships
    group by as_of_date, storecode, status

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        statuses.status,
        coalesce(by_status.memberships, 0) as memberships
    from stores
    cross join statuses
    left join by_status using (snapshot_date, storecode, status)

)

select * from final
