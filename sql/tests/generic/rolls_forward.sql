{#- A roll-forward adds up on every row: closing = opening + sum(plus) - sum(minus). -#}
{% test rolls_forward(model, opening, closing, plus, minus) %}

with rows_checked as (

    select * from {{ model }}

),

final as (

    select * from rows_checked
    where {{ closing }} <> {{ opening }}
        {%- for column in plus %} + {{ column }}{% endfor %}
        {%- for column in minus %} - {{ column }}{% endfor %}

)

select * from final

{% endtest %}
