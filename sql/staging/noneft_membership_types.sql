-- model: staging.noneft_membership_types
-- grain: one row per non-EFT membership type of the night's list
-- key: snapshot_date, membership_type_id
-- source: landing.noneft_membership_types
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    membership_type_id,
    name,
    price,
    term_months,
    storecode,
    extra
FROM landing.noneft_membership_types
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, membership_type_id
    ORDER BY _file_index DESC, _row DESC
) = 1
