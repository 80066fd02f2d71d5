{#- The model's key (one or more columns) is unique: each failing row is a duplicated key. -#}
{% test unique_combination(model, columns) %}

with keyed as (

    select {{ columns | join(', ') }}, count(*) as n_rows
    from {{ model }}
    group by {{ columns | join(', ') }}

),

final as (

    select * from keyed where n_rows > 1

)

select * from final

{% endtest %}
