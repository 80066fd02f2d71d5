-- The communication preferences of each client as of the newest committed night: the rows of the
-- client's snapshot (the logic shared with current_client_packages: macro current_snapshot_rows).

{{ current_snapshot_rows('stg_comm_prefs', 'current_comm_prefs') }}
