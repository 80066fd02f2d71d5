{#- Schemas are the layers themselves (staging, marts, reports), not <target>_<layer>: the schema
    the model's YAML names, else its folder. -#}
{% macro generate_schema_name(custom_schema_name, node) -%}
    {%- if custom_schema_name -%}
        {{ custom_schema_name | trim }}
    {%- elif node is not none and node.original_file_path and '/' in node.original_file_path -%}
        {{ node.original_file_path.split('/')[0] }}
    {%- else -%}
        {{ target.schema }}
    {%- endif -%}
{%- endmacro %}

{#- Staging models are named stg_<table> (dbt names are unique across layers: staging.transactions
    and marts.transactions both exist); their tables keep the landed table's name. The identified
    tier's models are named identified_<table> for the same reason (identity.top_debtors beside
    reports.top_debtors). -#}
{% macro generate_alias_name(custom_alias_name=none, node=none) -%}
    {%- if custom_alias_name -%}
        {{ custom_alias_name | trim }}
    {%- elif node.name.startswith('stg_') -%}
        {{ node.name[4:] }}
    {%- elif node.name.startswith('identified_') -%}
        {{ node.name[11:] }}
    {%- else -%}
        {{ node.name }}
    {%- endif -%}
{%- endmacro %}
