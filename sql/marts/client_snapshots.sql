-- model: marts.client_snapshots
-- grain: one row per committed night and client synced on or before it
-- key: as_of_date, client_number
-- Which snapshot holds a client's current state as of each night: the newest night <= as_of_date
-- on which the client was synced (staging.synced_clients). A client synced on a night landed its
-- whole state that night, so every "current" mart takes ALL of a client's rows from this one
-- snapshot: a ledger row that vanished is not resurrected from an older night, and a client not
-- changed tonight still counts with its last state.
WITH syncs AS (
    SELECT
        client_number,
        snapshot_date,
        lead(snapshot_date) OVER (PARTITION BY client_number ORDER BY snapshot_date) AS next_snapshot_date
    FROM staging.synced_clients
)
SELECT
    n.snapshot_date AS as_of_date,
    s.client_number,
    s.snapshot_date
FROM meta.nights AS n
JOIN syncs AS s
    ON n.snapshot_date >= s.snapshot_date
    AND (s.next_snapshot_date IS NULL OR n.snapshot_date < s.next_snapshot_date)
