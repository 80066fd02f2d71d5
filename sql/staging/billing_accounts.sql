-- model: staging.billing_accounts
-- grain: one row per billing account of a client synced on the night (secrets never land)
-- key: snapshot_date, billing_account_id
-- source: landing.billing_accounts
-- references: staging.synced_clients (snapshot_date, client_number)
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    billing_account_id,
    membership_id,
    type,
    deduct_type,
    last_four,
    exp_month,
    exp_year,
    extra
FROM landing.billing_accounts
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, billing_account_id
    ORDER BY _file_index DESC, _row DESC
) = 1
