-- model: staging.ledger_balances
-- grain: one row per client synced on the night and store where the client has a ledger
-- key: snapshot_date, client_number, storecode
-- source: landing.ledger_balances
-- references: staging.synced_clients (snapshot_date, client_number)
-- Landed rows of every committed night, typed by the landing zone; a key landed twice in one
-- night (a resumed batch) keeps its last written row.
SELECT
    snapshot_date,
    client_number,
    storecode,
    balance,
    as_of,
    extra
FROM landing.ledger_balances
QUALIFY row_number() OVER (
    PARTITION BY snapshot_date, client_number, storecode
    ORDER BY _file_index DESC, _row DESC
) = 1
