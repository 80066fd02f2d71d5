-- Each transaction line in its newest fetched version: events are fetched again when they change (a later
-- night may see a sale voided), and the newest fetched version wins. snapshot_date is the night
-- this version was first fetched (macro newest_versions).
-- Incremental (storage latest): only the keys fetched on the nights being built are compared with
-- their current version (source prior); the build stores only the versions that changed.

with fetched as (

    select * exclude (extra) from {{ ref('stg_transaction_lines') }}

),

{% if incremental_build() %}
current_versions as (

    select * from {{ source('prior', 'transaction_lines') }}

),

versions as (

    select * from fetched
    union all by name
    select current_versions.* from current_versions semi join fetched using (receipt_number, line_no)

),

untouched as (

    select current_versions.* from current_versions anti join fetched using (receipt_number, line_no)

),

{% else %}
versions as (

    select * from fetched

),

{% endif %}
newest as (

    {{ newest_versions('versions', 'receipt_number, line_no') }}

),

final as (

    select * from newest
    {% if incremental_build() %}
    union all by name
    select * from untouched
    {% endif %}

)

select * from final
