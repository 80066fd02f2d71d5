-- model: staging.eft_deduct_types
-- grain: one row per EFT deduct type of the night's list
-- key: snapshot_date, code
-- source: landing.eft_deduct_types
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    code,
    description,
    extra
FROM landing.eft_deduct_types
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, code
    ORDER BY _file_index DESC, _row DESC
) = 1
