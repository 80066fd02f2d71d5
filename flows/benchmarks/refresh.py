"""Benchmark of a full refresh of a landed history in bounded memory (not a test).

The history is landed first by the synthetic generator (:mod:`membersync.flows.benchmarks.synthetic`)::

    python -m membersync.flows.benchmarks.synthetic DIR --clients 10000 --nights 365 --rate 0.05
    python -m membersync.flows.benchmarks.refresh DIR --memory unset --memory 2GB --cgroup 2GB

Each ``--memory`` value is one full refresh (``membersync reports --full-refresh``'s build, then the
reports of the newest night and of every 30th night) in a child process with
``MEMBERSYNC_BUILD_MEMORY`` set to it (``unset``: the default, half the machine's memory); with
``--cgroup SIZE`` the child also runs inside a memory cgroup of that size (cgroup v1 or v2, as
root), so exceeding it is a kill, not a figure. Printed per run: wall time, the child's peak RSS
(its own ``VmHWM``), the batches, and whether every report equals the first run's byte for byte.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

CHILD = """
import json, sys, pathlib
from membersync.warehouse.build.builder import build_warehouse, committed_nights
from membersync.warehouse.exports.export import export_reports
from membersync.warehouse.landing.paths import DataDir
data_dir = DataDir(pathlib.Path(sys.argv[1]))
result = build_warehouse(data_dir, full_refresh=True)
nights = committed_nights(data_dir)
paths = [p for night in nights[::30] + nights[-1:] for p in export_reports(data_dir, night)]
status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]
sys.stdout.write(json.dumps({'peak_kb': int(status), 'batches': result.batches,
    'phases': result.phases, 'reports': [str(p) for p in paths]}) + '\\n')
"""


@contextlib.contextmanager
def memory_cgroup(limit: str | None) -> Iterator[Path | None]:
    """A fresh memory cgroup limited to ``limit`` (None: no cgroup), removed afterwards."""
    if limit is None:
        yield None
        return
    from membersync.extract.settings import parse_size

    size = parse_size(limit, 0)
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").is_file()
    group = Path("/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory") / f"membersync-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(size))
        yield group
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()


def refresh(data_dir: Path, memory: str, cgroup: str | None) -> dict[str, object]:
    """One full refresh and its reports in a child process: seconds, peak RSS, report digests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")}
    env["MEMBERSYNC_PREFECT"] = "off"
    if memory != "unset":
        env["MEMBERSYNC_BUILD_MEMORY"] = memory
    with memory_cgroup(cgroup) as group:
        procs = None if group is None else group / "cgroup.procs"

        def join() -> None:  # the child enters the cgroup before it execs Python
            if procs is not None:
                procs.write_text(str(os.getpid()))

        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(data_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=join,
        )
        seconds = time.monotonic() - started
    if proc.returncode != 0:
        return {"memory": memory, "cgroup": cgroup, "seconds": round(seconds, 1), "exit": proc.returncode}
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    digests = {Path(p).name: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in report["reports"]}
    return {
        "memory": memory,
        "cgroup": cgroup,
        "seconds": round(seconds, 1),
        "peak_mb": report["peak_kb"] // 1024,
        "batches": report["batches"],
        "phases": report["phases"],
        "digests": digests,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.refresh", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("data_dir", type=Path, help="a data dir with a landed history")
    parser.add_argument("--memory", action="append", help="MEMBERSYNC_BUILD_MEMORY of a run (or unset)")
    parser.add_argument("--cgroup", help="run each child in a memory cgroup of this size (root)")
    args = parser.parse_args(argv)
    landed = sum(p.stat().st_size for p in (args.data_dir / "landing").rglob("*.parquet"))
    sys.stdout.write(f"history: {landed / 1e6:.0f} MB landed in {args.data_dir}\n")
    first: dict[str, str] | None = None
    for memory in args.memory or ["unset"]:
        shutil.rmtree(args.data_dir / "reports", ignore_errors=True)
        run = refresh(args.data_dir, memory, args.cgroup)
        digests = run.pop("digests", None)
        if isinstance(digests, dict):
            first = first or digests
            run["reports"] = len(digests)
            run["reports_equal_first_run"] = digests == first
            whole = json.dumps(sorted(digests.items())).encode()
            run["reports_sha256"] = hashlib.sha256(whole).hexdigest()[:16]  # to compare across runs
        sys.stdout.write(json.dumps(run) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
