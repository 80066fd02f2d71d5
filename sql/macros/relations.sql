{#- Relations are rendered without the database name: the same compiled SQL runs in the build's
    scratch database and, as a view, in the published catalog (warehouse.duckdb), whatever name
    the reader opens it under. -#}
{% macro ref() %}
    {%- set relation = builtins.ref(*varargs, **kwargs) -%}
    {%- if relation is not none and relation.include is defined -%}
        {%- do return(relation.include(database=false)) -%}
    {%- endif -%}
    {%- do return(relation) -%}
{% endmacro %}

{% macro source() %}
    {%- set relation = builtins.source(*varargs, **kwargs) -%}
    {%- if relation is not none and relation.include is defined -%}
        {%- do return(relation.include(database=false)) -%}
    {%- endif -%}
    {%- do return(relation) -%}
{% endmacro %}

{#- true when this build continues a published warehouse (its state is source `prior`). -#}
{% macro incremental_build() -%}
    {{ return(var('incremental', false)) }}
{%- endmacro %}
