-- model: marts.current_billing_accounts
-- materialized: view
-- grain: one row per billing account (as of the newest committed night)
-- key: billing_account_id
SELECT * EXCLUDE (as_of_date)
FROM marts.billing_accounts_daily
WHERE as_of_date = (SELECT max(snapshot_date) FROM meta.nights)
