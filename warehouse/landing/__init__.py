"""The landing zone: what a night leaves in the data dir, and the only code that publishes it.

``zone.py`` holds the data dir's lock, opens or resumes a night and recovers after any crash;
``night.py`` stages a night's batches and commits it (its manifest last, ``manifest.py``);
``rewrite.py`` is the one way to change a committed night; ``atomic.py`` writes every file in
place; ``storage.py`` is where it publishes (local or S3); ``identity.py`` the surrogate keys,
their links and the erasure register; ``paths.py`` the data dir's layout; ``shard_area.py`` the
shards' area; ``crashpoints.py`` the named crash points; ``freshness.py`` how old the newest
night is.

Invariant: a reader sees whole nights or nothing; only ``night.py`` and ``rewrite.py`` publish.
"""
