-- Each points transaction in its newest fetched version: events are fetched again when they change
-- (a later night may see a sale voided), and the newest fetched version wins; snapshot_date is
-- the night that version was first fetched. Storage latest: a night's build compares only the
-- keys it fetched with their current version and stores what changed (macro newest_versions).

with fetched as (

    select * exclude (extra) from {{ ref('stg_points_transactions') }}

),

final as (

    {{ newest_versions('fetched', 'points_transactions', 'points_transaction_id') }}

)

select * from final
