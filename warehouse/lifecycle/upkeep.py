"""What every command that holds the data dir's lock does first: leave the data dir whole.

* a data dir of the earlier layout is migrated (:mod:`membersync.warehouse.lifecycle.migrate`), once;
* an erasure a crash left pending is finished (:mod:`membersync.warehouse.lifecycle.forget`);
* a retention run a crash left pending is finished (:mod:`membersync.warehouse.lifecycle.retention`).

``sync`` (its night's ``open``), ``reports``, ``audit``, ``forget`` and ``retention`` call
:func:`upkeep`; each step is idempotent and does nothing when there is nothing to do.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def upkeep(zone: Any) -> None:
    """Migrate, then finish what a crash left pending (the caller holds the lock)."""
    from membersync.warehouse.lifecycle.forget import finish_pending
    from membersync.warehouse.lifecycle.migrate import migrate_layout
    from membersync.warehouse.lifecycle.retention import finish_pending_retention

    migrate_layout(zone)
    finish_pending(zone)
    finish_pending_retention(zone)
