-- model: staging.employees
-- grain: one row per store asked and employee, per night
-- key: snapshot_date, query_storecode, emp_no
-- source: landing.employees
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    query_storecode,
    emp_no,
    first_name,
    last_name,
    storecode,
    role,
    extra
FROM landing.employees
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, query_storecode, emp_no
    ORDER BY _file_index DESC, _row DESC
) = 1
