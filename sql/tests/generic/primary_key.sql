{#- The model's key (one or more columns) identifies each row: no key column is null and no key
    is repeated. One query for both checks (as dbt_constraints' primary_key): each failing row is
    a key with its problem, 'null' (a key column is null) or 'duplicate' (n_rows > 1). -#}
{% test primary_key(model, columns) %}

with keyed as (

    select {{ columns | join(', ') }}, count(*) as n_rows
    from {{ model }}
    group by {{ columns | join(', ') }}

),

checked as (

    select
        case
            when {% for column in columns %}{{ column }} is null{% if not loop.last %} or {% endif %}{% endfor %}
                then 'null'
            when n_rows > 1 then 'duplicate'
        end as problem,
        *
    from keyed

),

final as (

    select * from checked
    where problem is not null
    -- a null key first: it explains the duplicates that follow from it
    order by problem = 'null' desc

)

select * from final

{% endtest %}
