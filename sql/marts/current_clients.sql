-- Client details as of the newest committed night (a view: it reads the newest night of
-- marts.clients_daily), with what the analyst tier may know of the person: birth year and the
-- postal code's first characters (their newest version; none once the client is forgotten).
{{ config(materialized='scratch_view') }}

with newest_night as (

    select max(snapshot_date) as snapshot_date from {{ source('meta', 'nights') }}

),

daily as (

    select * from {{ ref('clients_daily') }}

),

demographics as (

    select client_key, birth_year, postal_prefix from {{ ref('client_demographics') }}

),

final as (

    select
        daily.* exclude (as_of_date, snapshot_date),
        demographics.birth_year,
        demographics.postal_prefix,
        daily.snapshot_date
    from daily
    left join demographics using (client_key)
    where daily.as_of_date = (select snapshot_date from newest_night)

)

select * from final
