{#- Events (storage `latest`): each key's newest fetched version, with `snapshot_date` the night
    that version was first fetched (a later fetch of the same content does not move it; one that
    brings back an older content is a change). `fetched` is the CTE of the rows fetched on the
    nights being built, `prior_table` the model's own published versions (source `prior`), `key`
    its key columns.

    Incremental: the model holds only the keys fetched in the nights being built, each compared
    with its current version; the others stay in the published parts, never read whole. The
    build then stores only the rows dated in the nights it built: a one-night build stores what
    changed; a build of several nights (or a full refresh, which holds every key) stores each
    key's newest version, dated as the night-by-night builds would have dated it
    (tests/test_warehouse_incremental.py). -#}
{% macro newest_versions(fetched, prior_table, key) %}
    {%- if incremental_build() %}
    with current_versions as (
        {{ current_versions(prior_table, key, fetched, key) }}
    ),

    versions as (
        select * from {{ fetched }}
        union all by name
        select * from current_versions
    ),
    {%- else %}
    with versions as (
        select * from {{ fetched }}
    ),
    {%- endif %}

    compared as (
        select
            *,
            content is distinct from lag(content) over (
                partition by {{ key }} order by snapshot_date
            ) as changed
        from (
            select *, struct_pack(*columns(* exclude (snapshot_date))) as content
            from versions
        )
    ),

    dated as (
        select
            *,
            max(case when changed then snapshot_date end) over (partition by {{ key }}) as since,
            row_number() over (partition by {{ key }} order by snapshot_date desc) as newest_first
        from compared
    ),

    newest as (
        select * exclude (content, changed, since, newest_first) replace (since as snapshot_date)
        from dated
        where newest_first = 1
    )

    select * from newest
{% endmacro %}


{#- The current (newest stored) version of the keys of a latest model's published versions
    (source `prior`, `prior_table`) that match `matching` on the columns `on`, which must be key
    columns (every version of a key then matches alike, and the newest is picked among them).
    Reads the parts' columns, orders only the matching keys' versions. -#}
{% macro current_versions(prior_table, key, matching, on) %}
        select * from {{ source('prior', prior_table) }}
        semi join {{ matching }} using ({{ on }})
        qualify row_number() over (partition by {{ key }} order by snapshot_date desc) = 1
{% endmacro %}
