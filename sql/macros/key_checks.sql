{#- One row about `relation`'s key (a list of columns): its rows, the rows with a null key column,
    the keys repeated, and one repeated key as text (`2026-03-02, M1`) to show in a failure.
    The singular tests that check many models' keys in one query (staging_keys_and_landing,
    keys_of_marts_and_reports) select from it once per model, beside the model's name and its
    `key_columns` (the key as text), and take their failing rows from key_problems. -#}
{% macro key_counts(relation, key) %}
    select
        totals.n_rows,
        totals.null_keys,
        keys.duplicate_keys,
        keys.duplicate_example
    from (
        select
            count(*) as n_rows,
            count(*) filter (where {% for column in key %}{{ column }} is null{% if not loop.last %} or {% endif %}{% endfor %}) as null_keys
        from {{ relation }}
    ) as totals
    cross join (
        select
            count(*) filter (where n_rows > 1) as duplicate_keys,
            min(key_text) filter (where n_rows > 1) as duplicate_example
        from (
            select
                concat_ws(', '{% for column in key %}, {{ column }}::varchar{% endfor %}) as key_text,
                count(*) as n_rows
            from {{ relation }}
            group by {{ key | join(', ') }}
        )
    ) as keys
{% endmacro %}

{#- The failing rows of `counted` (rows of key_counts with `key_columns`): a null key column
    (rank 1, `not_null(<key>)`) and a repeated key (rank 2, `unique(<key>)`). -#}
{% macro key_problems(counted) %}
    select 1 as rank, 'null' as problem, 'not_null(' || key_columns || ')' as check_name, *
    from {{ counted }}
    where null_keys > 0

    union all

    select 2 as rank, 'duplicate' as problem, 'unique(' || key_columns || ')' as check_name, *
    from {{ counted }}
    where duplicate_keys > 0
{% endmacro %}
