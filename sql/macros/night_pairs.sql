{#- The roll-forwards' nights: each night built and the committed night before it (itself on the
    first night the warehouse holds: the baseline, no movement). Columns snapshot_date,
    previous_night. -#}
{% macro night_pairs() %}
    select
        ordered.snapshot_date,
        coalesce(ordered.previous_night, ordered.snapshot_date) as previous_night
    from (
        select snapshot_date, lag(snapshot_date) over (order by snapshot_date) as previous_night
        from {{ source('meta', 'nights') }}
    ) as ordered
    inner join {{ source('meta', 'build_nights') }} using (snapshot_date)
{% endmacro %}
