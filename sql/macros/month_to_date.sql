{#- A nightly per-store report to date within its calendar month, as of each night: the query of a
    `*_mtd` model over `daily` (a relation or CTE with snapshot_date, storecode, store_name and the
    columns named). `opening`: columns taken from the month's first night held; `sums`: summed
    over its nights up to this one (cast to `sum_type`); `closing`: this night's; `with_nights`:
    also first_night and nights. Stored per night, a month's figures outlive its daily nights
    (retention may thin a month to its last night; the `*_monthly` view reads each month's newest
    night). Incremental: the month to date of the night before the first night built comes from
    `prior` (the published model's newest night) and is added on. -#}
{% macro month_to_date(daily, prior, opening=[], sums=[], closing=[], sum_type='bigint', with_nights=true) %}
    {%- set carrying = incremental_build() -%}
    with running as (

        select
            cast(date_trunc('month', snapshot_date) as date) as month,
            storecode,
            snapshot_date as as_of_date,
            store_name,
            {% if with_nights -%}
            min(snapshot_date) over to_date as first_night,
            count(*) over to_date as nights,
            {% endif -%}
            {% for column in opening -%}
            first_value({{ column }}) over to_date as {{ column }},
            {% endfor -%}
            {% for column in sums -%}
            sum({{ column }}) over to_date as {{ column }},
            {% endfor -%}
            {% for column in closing -%}
            {{ column }},
            {% endfor -%}
        from {{ daily }}
        window to_date as (
            partition by date_trunc('month', snapshot_date), storecode
            order by snapshot_date
            rows between unbounded preceding and current row
        )

    ){% if carrying %},

    carried as (

        select * from {{ prior }}

    ){% endif %}

    select
        running.month,
        running.storecode,
        running.as_of_date,
        running.store_name,
        {% if with_nights and carrying -%}
        coalesce(carried.first_night, running.first_night) as first_night,
        running.nights + coalesce(carried.nights, 0) as nights,
        {% elif with_nights -%}
        running.first_night,
        running.nights,
        {% endif -%}
        {% for column in opening -%}
        {% if carrying %}coalesce(carried.{{ column }}, running.{{ column }}){% else %}running.{{ column }}{% endif %} as {{ column }},
        {% endfor -%}
        {% for column in sums -%}
        cast(running.{{ column }}{% if carrying %} + coalesce(carried.{{ column }}, 0){% endif %} as {{ sum_type }}) as {{ column }},
        {% endfor -%}
        {% for column in closing -%}
        running.{{ column }},
        {% endfor -%}
    from running
    {% if carrying -%}
    left join carried
        on carried.month = running.month and carried.storecode = running.storecode
    {%- endif %}
{% endmacro %}


{#- A `*_mtd` model's newest night of each month and store: the month's figures (the `*_monthly`
    views read them). -#}
{% macro newest_in_month(mtd) %}
    select * from {{ mtd }}
    qualify row_number() over (partition by month, storecode order by as_of_date desc) = 1
{% endmacro %}
