{#- A `view` model in the build's scratch database (storage `view`: the published catalog holds
    its SQL as a view over the other models). As with scratch_table: the scratch database is new
    for every build, so dbt's `view` dance (an intermediate relation, a backup, renames, grants)
    protects nothing here: one `create view as`, ~1/3 of the per-node time of dbt's own. -#}
{% materialization scratch_view, adapter="duckdb" %}

  {%- set target_relation = this.incorporate(type='view') -%}

  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {{ run_hooks(pre_hooks, inside_transaction=True) }}

  {% call statement('main') -%}
    create view {{ target_relation }} as (
      {{ compiled_code }}
    )
  {%- endcall %}

  {{ run_hooks(post_hooks, inside_transaction=True) }}
  {{ adapter.commit() }}
  {{ run_hooks(post_hooks, inside_transaction=False) }}

  {{ return({'relations': [target_relation]}) }}

{% endmaterialization %}
