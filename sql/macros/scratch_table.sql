{#- A model's table in the build's scratch database (the project's default materialization).
    The scratch database is new for every build and each model is built once in it, so dbt's
    `table` dance (an intermediate relation, a backup, two renames, grants, docs persisted as
    comments) protects nothing here: one `create table as`. It is ~1/3 of a table model's
    statements, and the cheaper half of dbt's per-node work a build pays 49 times. -#}
{% materialization scratch_table, adapter="duckdb" %}

  {%- set target_relation = this.incorporate(type='table') -%}

  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {{ run_hooks(pre_hooks, inside_transaction=True) }}

  {% call statement('main') -%}
    create table {{ target_relation }} as (
      {{ compiled_code }}
    )
  {%- endcall %}

  {{ run_hooks(post_hooks, inside_transaction=True) }}
  {{ adapter.commit() }}
  {{ run_hooks(post_hooks, inside_transaction=False) }}

  {{ return({'relations': [target_relation]}) }}

{% endmaterialization %}
