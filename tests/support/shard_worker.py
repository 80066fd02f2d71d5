"""One shard of a sharded night, as a process (what a shard run does on a worker, without Prefect).

    python tests/support/shard_worker.py SHARD NIGHT RUN_ID     (settings from MEMBERSYNC_*)

Prints the shard's counts as JSON. ``MEMBERSYNC_CRASH_AT=after_shard_batch:N`` kills it (SIGKILL)
after its N-th batch, as a lost worker.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys

from membersync.extract.client import ClientOptions
from membersync.extract.settings import ServiceSettings, Settings
from membersync.flows.night.shards import land_shard
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.shard_area import ShardArea


def main() -> None:
    shard, night, run_id = int(sys.argv[1]), dt.date.fromisoformat(sys.argv[2]), sys.argv[3]
    config = Settings.load()
    area = ShardArea(DataDir.from_settings(config), night, run_id)
    counts = asyncio.run(
        land_shard(ServiceSettings.from_settings(config), area, shard, ClientOptions.from_settings(config), 1)
    )
    sys.stdout.write(json.dumps(counts) + "\n")


if __name__ == "__main__":
    main()
