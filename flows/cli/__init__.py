"""The one way in: every ``membersync`` command (``commands.py``), each command group in a small
module of its own (``sync_cli.py``, ``reports_cli.py``, ``privacy_cli.py``, ``audit_cli.py``,
``freshness_cli.py``), the demo (``demo.py``), the documentation's generated tables
(``docs_tables.py``); all of them print through :mod:`membersync.flows.console`.

Invariant: a command answers bad input with one ``error:`` line and a non-zero exit before it
changes anything.
"""
