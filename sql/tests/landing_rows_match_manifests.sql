{#- The rows read from each night's files equal the row counts its manifest recorded, for every
    landed table (and the quarantine): a file that is short, swapped or unreadable fails here. -#}
{{ config(meta={'check': 'manifest_rows'}) }}

with expected as (

    select table_name, snapshot_date, rows as expected_rows
    from {{ source('meta', 'manifest_rows') }}

),

found as (

    {% for table_name in var('landing_tables') %}
    select '{{ table_name }}' as table_name, snapshot_date, count(*) as found_rows
    from {{ source('landing', table_name) }}
    group by snapshot_date
    {% if not loop.last %}union all{% endif %}
    {% endfor %}

),

final as (

    select
        expected.table_name,
        expected.snapshot_date,
        expected.expected_rows,
        coalesce(found.found_rows, 0) as found_rows
    from expected
    left join found using (table_name, snapshot_date)
    where coalesce(found.found_rows, 0) <> expected.expected_rows

)

select * from final
