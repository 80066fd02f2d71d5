"""One night's context: built once per command, handed down to the night (issue 60).

``membersync sync`` (and the demo) read the environment once (:class:`Settings`, checked),
make the notifier (a bad ``MEMBERSYNC_NOTIFY`` fails before any work), choose the progress (a
terminal bar or none) and take the data dir's lock; the night, run directly or as a Prefect flow
in the same process, uses that same context, lock included. Before it, the flow read the
environment again, took the lock a second time (through a re-entrant registry) and found the
progress bar in a module global.

A flow's parameters are recorded by its server, so a context cannot be one: the command hands it
down under a key (:func:`handed_down`), the flow takes it by that key (:func:`context_for`). A
flow run in another process (a schedule, a worker) has no context handed down and builds its
own from that process's environment.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from membersync.extract.settings import ServiceSettings, Settings
from membersync.flows.night.nightly import holding_lock
from membersync.flows.night.notify import Notifier
from membersync.flows.night.options import SyncOptions
from membersync.flows.night.progress import Progress
from membersync.warehouse.landing.paths import DataDir


@dataclass
class NightContext:
    """What a night needs from its command. ``zone`` is the locked landing zone while
    :meth:`lock` holds it."""

    config: Settings
    settings: ServiceSettings
    options: SyncOptions
    data_dir: DataDir
    notifier: Notifier
    progress: Progress | None = None
    zone: Any = None

    @classmethod
    def load(cls, config: Settings | None = None, options: SyncOptions | None = None) -> NightContext:
        """From the environment (or ``config``); raises SettingsError or ProfileError, one line
        naming the setting, before any work."""
        config = config or Settings.load()  # every MEMBERSYNC_* variable, read and checked once
        settings = ServiceSettings.from_settings(config)
        settings.profile()
        return cls(
            config=config,
            settings=settings,
            options=options or SyncOptions.from_settings(config),
            data_dir=DataDir.from_settings(config),
            notifier=Notifier.from_settings(config),
        )

    @contextlib.contextmanager
    def lock(self, wait: bool = False) -> Iterator[Any]:
        """The data dir's lock for this night: the one the command holds, else taken now
        (``wait``: once its holder, if any, is done)."""
        if self.zone is not None:
            yield self.zone
            return
        with holding_lock(self.data_dir, wait) as zone:
            self.zone = zone
            try:
                yield zone
            finally:
                self.zone = None


_HANDED: dict[str, NightContext] = {}  # the contexts handed down to a flow of this process


@contextlib.contextmanager
def handed_down(context: NightContext) -> Iterator[str]:
    """While the block runs, ``context`` is what a flow of this process finds under the key yielded."""
    key = uuid.uuid4().hex
    _HANDED[key] = context
    try:
        yield key
    finally:
        del _HANDED[key]


def context_for(key: str | None, config: Settings | None = None) -> NightContext:
    """The context the command handed down under ``key``; without one (a flow run in another
    process), one built from this process's environment (or ``config``)."""
    handed = _HANDED.get(key) if key else None
    return handed if handed is not None else NightContext.load(config)
