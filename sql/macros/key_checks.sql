{#- One row about `relation`'s key (a list of columns): its rows, the rows with a null key column,
    the keys repeated, and one repeated key as text (`2026-03-02, M1`) to show in a failure.
    The singular tests that check many models' keys in one query (staging_keys_and_landing,
    keys_of_marts_and_reports) select from it once per model, beside the model's name and its
    `key_columns` (the key as text), and take their failing rows from key_problems. -#}
{% macro key_counts(relation, key) %}
    -- one scan and one grouping per model: a key's rows are counted once, its text made once
    select
        coalesce(sum(n_rows), 0) as n_rows,
        coalesce(sum(n_rows) filter (where {% for column in key %}{{ column }} is null{% if not loop.last %} or {% endif %}{% endfor %}), 0) as null_keys,
        count(*) filter (where n_rows > 1) as duplicate_keys,
        min(concat_ws(', '{% for column in key %}, {{ column }}::varchar{% endfor %})) filter (where n_rows > 1) as duplicate_example
    from (
        select {{ key | join(', ') }}, count(*) as n_rows
        from {{ relation }}
        group by {{ key | join(', ') }}
    )
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
