-- Amount owed per store and night, by the age of each client's debt at the store: the days since
-- the client's balance at the store was last <= 0 on a committed night (no ledger row at the
-- store that night counts as 0). When the balance was > 0 on every night the warehouse held (the
-- first nights of its history), the debt is aged as if the balance had been <= 0 the day before
-- the first night: a lower bound, so a debt older than our history shows in 30-59 only from the
-- 30th night on, in 90+ only from the 90th. Buckets: 0-29, 30-59, 60-89, 90+ days.
-- Stored per night (marts.debts_daily dates each debt as the nights are built), so a night's
-- aging stays as it was when retention later removes older nights.

with stores as (

    select * from {{ ref('stg_stores') }}

),

aged as (

    select as_of_date as snapshot_date, storecode, client_key, balance, as_of_date - debt_since as age_days
    from {{ ref('debts_daily') }}

),

by_store as (

    select
        snapshot_date,
        storecode,
        count(*) as clients_owing,
        sum(balance) as amount_owed,
        sum(balance) filter (where age_days < 30) as owed_0_29,
        sum(balance) filter (where age_days >= 30 and age_days < 60) as owed_30_59,
        sum(balance) filter (where age_days >= 60 and age_days < 90) as owed_60_89,
        sum(balance) filter (where age_days >= 90) as owed_90_plus,
        count(*) filter (where age_days >= 90) as clients_90_plus
    from aged
    group by snapshot_date, storecode

),

final as (

    select
        stores.snapshot_date,
        stores.storecode,
        stores.name as store_name,
        coalesce(by_store.clients_owing, 0) as clients_owing,
        cast(coalesce(by_store.amount_owed, 0) as decimal(38, 2)) as amount_owed,
        cast(coalesce(by_store.owed_0_29, 0) as decimal(38, 2)) as owed_0_29,
        cast(coalesce(by_store.owed_30_59, 0) as decimal(38, 2)) as owed_30_59,
        cast(coalesce(by_store.owed_60_89, 0) as decimal(38, 2)) as owed_60_89,
        cast(coalesce(by_store.owed_90_plus, 0) as decimal(38, 2)) as owed_90_plus,
        coalesce(by_store.clients_90_plus, 0) as clients_90_plus
    from stores
    left join by_store using (snapshot_date, storecode)

)

select * from final
