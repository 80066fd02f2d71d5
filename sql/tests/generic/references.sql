{#- Every value of (columns) exists in `to` (dbt's relationships test, for a compound key). -#}
{% test references(model, to, columns) %}

with missing as (

    select {{ columns | join(', ') }} from {{ model }}
    except
    select {{ columns | join(', ') }} from {{ to }}

),

final as (

    select * from missing

)

select * from final

{% endtest %}
