{#- A staging model keeps one row per distinct key of its landing table: nothing lost, nothing made
    up (duplicates landed in one night are dropped, and counted by the build). -#}
{% test reconciles_with_landing(model, landed, key) %}

with staged as (

    select count(*) as n_rows from {{ model }}

),

distinct_landed as (

    select count(*) as n_keys from (select distinct {{ key | join(', ') }} from {{ source('landing', landed) }})

),

final as (

    select staged.n_rows, distinct_landed.n_keys
    from staged
    cross join distinct_landed
    where staged.n_rows <> distinct_landed.n_keys

)

select * from final

{% endtest %}
