{#- The newest version of each key among `versions` (a CTE name), dated by the night its content
    last changed: `snapshot_date` is the night this version was first fetched, and a later fetch
    of the same content does not move it. So an event table's build writes only what changed in
    the nights it builds (storage `latest`), and a full refresh dates every row the same way as the
    incremental builds that led to it (a fetch that brings back an older content is a change). -#}
{% macro newest_versions(versions, key) %}
    select * exclude (content, changed, since, newest_first) replace (since as snapshot_date)
    from (
        select
            *,
            max(case when changed then snapshot_date end) over (partition by {{ key }}) as since,
            row_number() over (partition by {{ key }} order by snapshot_date desc) as newest_first
        from (
            select
                *,
                content is distinct from lag(content) over (
                    partition by {{ key }} order by snapshot_date
                ) as changed
            from (
                select *, struct_pack(*columns(* exclude (snapshot_date))) as content
                from {{ versions }}
            )
        )
    )
    where newest_first = 1
{% endmacro %}
