"""One night of one tenant: its steps (``nightly.py``; how it runs: ``options.py``; what it did:
``summary.py``), their work (``batches.py``), the
self-audit (``audit.py``), a large tenant's shards (``shards.py``), the Prefect flow around them
(``prefect_flow.py``, ``prefect_api.py``), and what a night carries (``context.py``,
``progress.py``, ``interrupt.py``, ``notify.py``, ``logfile.py``, ``nightgc.py``).

Invariant: a night commits whole or not at all, and nothing here imports the CLI or the pool.
"""
