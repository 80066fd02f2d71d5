-- Each transaction line in its newest fetched version: events are fetched again when they change
-- (a later night may see a sale voided), and the newest fetched version wins.
-- Incremental: merged by key, the versions fetched on the nights being built against the
-- previous build's table (source prior).

with fetched_tonight as (

    select * exclude (extra) from {{ ref('stg_transaction_lines') }}

),

fetched as (

    select * from fetched_tonight
    {% if incremental_build() %}
    union all by name
    select * from {{ source('prior', 'transaction_lines') }}
    {% endif %}

),

final as (

    select * from fetched
    qualify row_number() over (partition by receipt_number, line_no order by snapshot_date desc) = 1

)

select * from final
