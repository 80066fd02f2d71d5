-- The top-debtors report as managers read it (the identified tier; its CSV, workbook sheet and
-- morning report section): reports.top_debtors with each client's number and name, the ties at
-- the 50th balance broken by client number. A forgotten client shows as "forgotten client", with
-- their surrogate key in place of the number.
{{ config(materialized='scratch_view') }}

with debtors as (

    select * from {{ ref('top_debtors') }}

),

clients as (

    select * from {{ ref('identified_clients') }}

),

named as (

    select
        debtors.*,
        clients.client_number as known_number,
        clients.client_name as known_name,
        row_number() over (
            partition by debtors.snapshot_date, debtors.storecode
            order by debtors.balance desc, clients.client_number nulls last, debtors.client_key
        ) as position
    from debtors
    left join clients using (client_key)

),

final as (

    select
        snapshot_date,
        storecode,
        coalesce(known_number, client_key) as client_number,
        case when known_number is null then 'forgotten client' else known_name end as client_name,
        balance,
        active_memberships,
        eft_on_file,
        last_payment_date
    from named
    where position <= 50

)

select * from final
