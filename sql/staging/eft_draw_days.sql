-- model: staging.eft_draw_days
-- grain: one row per EFT draw day of the night's list
-- key: snapshot_date, day
-- source: landing.eft_draw_days
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    day,
    description,
    extra
FROM landing.eft_draw_days
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, day
    ORDER BY _file_index DESC, _row DESC
) = 1
