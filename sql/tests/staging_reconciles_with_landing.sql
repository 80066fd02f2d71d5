{#- Every staging model keeps one row per distinct key of its landing table: nothing lost, nothing
    made up (duplicates landed in one night are dropped, and counted by the build). The staging
    model of landed table <t> is stg_<t> (building staging.<t>), its key its YAML's meta.key.

    One query for all 26 staging models rather than a generic test on each: every test node costs
    dbt ~30 ms of its own Python per build whatever its SQL, and this check names the model it
    fails on all the same (columns model and check_name; `meta.checks` lists it per model). -#}
{{ config(meta={'check': 'reconciles_with_landing'}) }}

{%- set staged_tables = var('landing_tables') | reject('equalto', 'quarantine') | list %}

with counted as (

    {% for table_name in staged_tables %}
    {%- set staged = ref('stg_' ~ table_name) %}
    {%- set key = graph.nodes['model.membersync.stg_' ~ table_name].config.meta.key if execute else [] %}
    select
        'staging.{{ table_name }}' as model,
        'reconciles_with(landing.{{ table_name }})' as check_name,
        (select count(*) from {{ staged }}) as staged_rows,
        (
            select count(*)
            from (select distinct {{ key | join(', ') if key else '*' }} from {{ source('landing', table_name) }})
        ) as landed_keys
    {% if not loop.last %}union all{% endif %}
    {% endfor %}

),

final as (

    select * from counted
    where staged_rows <> landed_keys

)

select * from final
