{#- Every mart and report, in one query: its key (its YAML's meta.key) has no null column and no
    repeated value. The models are dbt's var `keyed_models` (a build fails naming any mart or
    report that is not in it; tests/test_declared_once.py checks the list too).

    One test rather than a key test per model: a test node costs dbt ~30 ms of its own Python per
    build whatever its SQL, and 34 of them were ~1 s of every build's ~3.6 s of CPU (50 clients).
    A failing row names its model and check (`not_null(<key>)`, `unique(<key>)`) with the
    repeated key shown; `meta.checks` lists both checks for every model. As in the scratch database
    every build holds only the nights it builds, each build checks the keys of those nights. -#}
{{ config(meta={'check': 'keys_of_marts_and_reports'}) }}

with counted as (

    {% for model_name in var('keyed_models') %}
    {%- set model = ref(model_name) %}
    {%- set node = graph.nodes['model.membersync.' ~ model_name] if execute else none %}
    {%- set key = node.config.meta.key if execute else ['snapshot_date'] %}
    select
        '{{ node.config.schema if execute else "" }}.{{ model_name }}' as model,
        '{{ key | join(", ") }}' as key_columns,
        counts.*
    from ({{ key_counts(model, key) }}) as counts
    {% if not loop.last %}union all{% endif %}
    {% endfor %}

),

checks as (

    {{ key_problems('counted') }}

),

final as (

    -- a null key first: it explains the duplicates that follow from it
    select
        model,
        check_name,
        problem,
        n_rows,
        null_keys,
        duplicate_keys,
        duplicate_example
    from checks
    order by rank, model

)

select * from final
