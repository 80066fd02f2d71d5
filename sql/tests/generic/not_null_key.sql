{#- No column of the model's key is null (dbt's not_null, for every key column in one query). -#}
{% test not_null_key(model, columns) %}

with keys as (

    select {{ columns | join(', ') }} from {{ model }}

),

final as (

    select * from keys
    where {% for column in columns %}{{ column }} is null{% if not loop.last %} or {% endif %}{% endfor %}

)

select * from final

{% endtest %}
