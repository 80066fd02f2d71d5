-- model: staging.web_docs
-- grain: one row per web document of the night's list
-- key: snapshot_date, doc_id
-- source: landing.web_docs
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    doc_id,
    name,
    extra
FROM landing.web_docs
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, doc_id
    ORDER BY _file_index DESC, _row DESC
) = 1
