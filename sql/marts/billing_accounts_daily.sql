-- Billing accounts as of each night (the rows of each client's snapshot). Only the non-secret
-- fields land (no token, vault token, account or routing number).
-- Incremental: older snapshots' rows come from the previous night's partition (source prior).

with snapshots as (

    select * from {{ ref('client_snapshots') }}

),

accounts_tonight as (

    select
        snapshot_date,
        client_key,
        billing_account_id,
        membership_id,
        type,
        deduct_type,
        last_four,
        exp_month,
        exp_year
    from {{ ref('stg_billing_accounts') }}

),

accounts as (

    select * from accounts_tonight
    {% if incremental_build() %}
    union all by name
    select * exclude (as_of_date) from {{ source('prior', 'billing_accounts_daily') }}
    {% endif %}

),

final as (

    select
        snapshots.as_of_date,
        accounts.client_key,
        accounts.billing_account_id,
        accounts.membership_id,
        accounts.type,
        accounts.deduct_type,
        accounts.last_four,
        accounts.exp_month,
        accounts.exp_year,
        snapshots.snapshot_date
    from snapshots
    inner join accounts using (client_key, snapshot_date)

)

select * from final
