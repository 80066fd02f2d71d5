-- The client packages of each client as of the newest committed night: the rows of the
-- client's snapshot (the logic shared with current_comm_prefs: macro current_snapshot_rows).

{{ current_snapshot_rows('stg_client_packages', 'current_client_packages') }}
