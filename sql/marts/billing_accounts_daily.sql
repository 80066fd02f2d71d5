-- model: marts.billing_accounts_daily
-- grain: one row per committed night and billing account (as of that night)
-- key: as_of_date, billing_account_id
-- Only the non-secret fields land (no token, vault token, account or routing number).
SELECT
    c.as_of_date,
    b.client_number,
    b.billing_account_id,
    b.membership_id,
    b.type,
    b.deduct_type,
    b.last_four,
    b.exp_month,
    b.exp_year,
    c.snapshot_date
FROM marts.client_snapshots AS c
JOIN staging.billing_accounts AS b USING (client_number, snapshot_date)
