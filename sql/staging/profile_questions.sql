-- model: staging.profile_questions
-- grain: one row per profile question of the night's list
-- key: snapshot_date, question_id
-- source: landing.profile_questions
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    question_id,
    text,
    answer_type,
    choices,
    extra
FROM landing.profile_questions
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, question_id
    ORDER BY _file_index DESC, _row DESC
) = 1
