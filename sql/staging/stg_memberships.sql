-- Statuses compare case-insensitively: lower-cased, with spaces, underscores and dashes
-- ignored (OnHold, on hold, ON_HOLD -> on_hold). A status outside the contract's list is
-- 'other'; the vendor's spelling stays in status_raw.
with landed as (

    select * from {{ source('landing', 'memberships') }}

),

deduplicated as (

    -- a key landed twice in one night (a resumed batch) keeps its last written row
    select * from landed
    qualify row_number() over (
        partition by snapshot_date, membership_id
        order by _file_index desc, _row desc
    ) = 1

),

final as (

    select
        snapshot_date,
        client_key,
        membership_id,
        membership_type_id,
        name,
        is_eft,
        case replace(replace(replace(lower(trim(status)), ' ', ''), '_', ''), '-', '')
            when 'active' then 'active'
            when 'frozen' then 'frozen'
            when 'onhold' then 'on_hold'
            when 'canceled' then 'canceled'
            when 'expired' then 'expired'
            else 'other'
        end as status,
        status as status_raw,
        storecode,
        start_date,
        end_date,
        draw_day,
        monthly_dues,
        price,
        freeze_start_date,
        freeze_end_date,
        cancel_date,
        last_modified,
        extra
    from deduplicated

)

select * from final
