"""A subprocess that lands a synthetic night, for the SIGKILL / RLIMIT tests of the landing zone.

``python tests/support/landing_worker.py DATA_DIR NIGHT BATCHES ROWS
[--fsize-limit BYTES] [--limit-at write|commit]``

It types deterministic memberships with ``BatchBuilder`` (the same rows every run, so a rerun
must produce exactly one copy), writes the batches that are not done yet, and commits. Lines on
stdout: ``ready <run_id> resumed=<bool>``, ``wrote <batch>``, ``skipped <batch>``,
``committed <run_id>``, or ``write-error <message>`` (exit code 3).
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import signal
import sys
from pathlib import Path

from membersync.models.coerce import BatchBuilder, quarantine_table
from membersync.warehouse.landing.night import LandingWriteError
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import LandingZone


def batch_items(batch: int, rows: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(rows):
        n = batch * rows + i
        out.append(
            {
                "membershipId": f"M{n:09d}",
                "status": "Active",
                "storecode": "DOWNTOWN  ",
                "monthlyDues": f"{n % 500}.{n % 100:02d}",
                # incompressible-ish filler, so files have some size
                "name": f"member {n} " + format(n * 2654435761 % 2**64, "x") * 4,
                "password": "CANARY-SECRET-WORKER",
            }
        )
    out.append({"membershipId": f"BAD{batch}", "monthlyDues": "1.005"})  # one quarantined row
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("night")
    parser.add_argument("batches", type=int)
    parser.add_argument("rows", type=int)
    parser.add_argument("--fsize-limit", type=int, default=0)
    parser.add_argument("--limit-at", choices=("write", "commit"), default="write")
    args = parser.parse_args()

    night = dt.date.fromisoformat(args.night)
    zone = LandingZone(DataDir(Path(args.data_dir)))

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))

    with zone.lock():
        run = zone.open_night(night, "full")
        print(f"ready {run.run_id} resumed={run.resumed}", flush=True)
        if run.saved_discovery() is None:
            run.save_discovery([{"clientNumber": f"{b:06d}"} for b in range(args.batches)], 1)
        done = run.done_batches()
        try:
            if args.fsize_limit and args.limit_at == "write":
                limit()
            for b in range(args.batches):
                batch_id = f"b{b:04d}"
                if batch_id in done:
                    print(f"skipped {batch_id}", flush=True)
                    continue
                builder = BatchBuilder()
                builder.add("memberships", batch_items(b, args.rows), {"clientNumber": f"{b:06d}"})
                landed = builder.build()["memberships"]
                run.write_batch(batch_id, {"memberships": landed.table}, quarantine_table(landed.quarantine))
                print(f"wrote {batch_id}", flush=True)
            if args.fsize_limit and args.limit_at == "commit":
                limit()
            manifest = run.commit("2026-11-21T01:00:00Z", args.batches, {"worker": True})
        except LandingWriteError as exc:
            print(f"write-error {exc}", flush=True)
            return 3
        print(f"committed {manifest.run_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
