{#- Every staging model, in one query: its key (its YAML's meta.key) has no null column and no
    repeated value, and it keeps one row per distinct key of its landed table (nothing lost,
    nothing made up: duplicates landed in one night are dropped, and counted by the build). The
    staging model of landed table <t> is stg_<t>, building staging.<t>.

    One test rather than a primary_key and a reconciliation test on each of the 26 models: a test
    node costs dbt ~30 ms of its own Python per build whatever its SQL, 52 nodes ~1.7 s a build.
    A failing row names its model and check as those tests did (`not_null(<key>)`,
    `unique(<key>)`, `reconciles_with(landing.<t>)`); `meta.checks` lists all three per model. -#}
{{ config(meta={'check': 'staging_keys_and_landing'}) }}

{%- set staged_tables = var('landing_tables') | reject('equalto', 'quarantine') | list %}

with counted as (

    {% for table_name in staged_tables %}
    {%- set staged = ref('stg_' ~ table_name) %}
    {%- set key = graph.nodes['model.membersync.stg_' ~ table_name].config.meta.key if execute else ['snapshot_date'] %}
    select
        'staging.{{ table_name }}' as model,
        '{{ table_name }}' as landed,
        '{{ key | join(", ") }}' as key_columns,
        counts.n_rows as staged_rows,
        counts.null_keys,
        counts.duplicate_keys,
        counts.duplicate_example,
        (
            select count(*)
            from (select distinct {{ key | join(', ') }} from {{ source('landing', table_name) }})
        ) as landed_keys
    from ({{ key_counts(staged, key) }}) as counts
    {% if not loop.last %}union all{% endif %}
    {% endfor %}

),

checks as (

    {{ key_problems('counted') }}

    union all

    select 3 as rank, 'count' as problem, 'reconciles_with(landing.' || landed || ')' as check_name, *
    from counted
    where staged_rows <> landed_keys

),

final as (

    -- a broken key first: it explains a count that does not reconcile
    select
        model,
        check_name,
        problem,
        staged_rows,
        null_keys,
        duplicate_keys,
        duplicate_example,
        landed_keys
    from checks
    order by rank, model

)

select * from final
