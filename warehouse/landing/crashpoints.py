"""Named crash points, for proving that a crash anywhere loses nothing.

``MEMBERSYNC_CRASH_AT=<point>[:<n>]`` makes the process kill itself with SIGKILL the n-th time
(default: first) it reaches ``<point>``. Nothing runs after it: no ``finally``, no atexit, no
flush, exactly as if the machine lost power for this process. Unset (always, outside the
reliability tests), a crash point costs one dictionary lookup.

The points sit at the step boundaries of a night:

- ``after_batch_landed``: a batch's files and its done marker are staged
- ``before_commit``: every batch is staged, nothing published yet
- ``after_publish``: files are in their published paths, the manifest is not yet written
- ``after_commit``: the manifest (the commit) is written, the state is not yet saved
- ``after_state_saved``: the state is saved, the staging area not yet cleaned
- ``during_warehouse_build``: the new warehouse file is half built

and one in a shard of a sharded night (:data:`SHARD_POINTS`, ``tests/scenarios/test_shards.py``):

- ``after_shard_batch``: a shard wrote a batch and its marker to the shard area

and the steps of an erasure (:data:`FORGET_POINTS`, ``membersync forget``,
:mod:`membersync.warehouse.lifecycle.forget`):

- ``forget_after_register``: the erasure is in the register (pending), nothing else done
- ``forget_after_scrub``: logs and state scrubbed, staging discarded, no identity file rewritten
- ``forget_after_recommit``: a night's manifest names its rewritten files, the old ones not yet deleted
- ``forget_after_rewrite``: every identity file rewritten, the catalogs not yet repointed, the old files kept
- ``forget_after_reexport``: reports re-exported, the erasure not yet marked done

and one of the migration to the layout with identity apart (:mod:`membersync.warehouse.lifecycle.migrate`):

- ``migrate_after_night``: a night's manifest names its migrated files, its old files not yet deleted

and one of a full refresh built in batches of nights (:mod:`membersync.warehouse.build.builder`):

- ``after_refresh_batch``: a batch's parts are written, the next batch not begun, nothing published

and one of the PostgreSQL publication (:mod:`membersync.warehouse.exports.postgres`):

- ``publish_mid_night``: half a night's tables copied into its transaction, not committed
"""

from __future__ import annotations

import os
import signal

from membersync.extract.settings import env_name

ENV = env_name("crash_at")
POINTS = (
    "after_batch_landed",
    "before_commit",
    "after_publish",
    "after_commit",
    "after_state_saved",
    "during_warehouse_build",
)
SHARD_POINTS = ("after_shard_batch",)  # a shard's, never reached by an unsharded night
FORGET_POINTS = (
    "forget_after_register",
    "forget_after_scrub",
    "forget_after_recommit",
    "forget_after_rewrite",
    "forget_after_reexport",
)
MIGRATE_POINTS = ("migrate_after_night",)
REFRESH_POINTS = ("after_refresh_batch",)
PUBLISH_POINTS = ("publish_mid_night",)
_seen: dict[str, int] = {}


def crashpoint(name: str) -> None:
    """Die here (SIGKILL) when ``MEMBERSYNC_CRASH_AT`` names this point and its count is reached."""
    wanted = os.environ.get(ENV)  # read at each point, not once: tests set it per child process
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
