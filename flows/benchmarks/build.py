"""Benchmark of one night's warehouse build as history accumulates (not a test).

For each night K asked, the synthetic history (:mod:`membersync.warehouse.synthetic`) is landed up
to night K - 2 and built, then night K - 1 and built (neither measured: the second is incremental,
as every production build after the first), then night K is landed and **its** build is measured
in a child process: wall time and peak RSS (``wait4``'s ``ru_maxrss``: the child alone, Python,
DuckDB and dbt included).

    python -m membersync.flows.benchmarks.build --clients 5000 --night 2 --night 30 --night 90
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from membersync.warehouse.paths import DataDir
from membersync.warehouse.synthetic import History, generate

CHILD = (
    "import sys\n"
    "from membersync.warehouse.build import build_warehouse\n"
    "from membersync.warehouse.paths import DataDir\n"
    "build_warehouse(DataDir(__import__('pathlib').Path(sys.argv[1])))\n"
)


def measured_build(data_dir: DataDir) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one build in a child process."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(data_dir.root)])
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed with exit code {proc.returncode}")
    return seconds, usage.ru_maxrss / 1024


def run(clients: int, nights: list[int], rate: float, workdir: Path) -> list[tuple[int, float, float]]:
    data_dir = DataDir(workdir / "data")
    history: History | None = None
    landed = 0
    out = []

    def land_to(count: int) -> None:
        nonlocal history, landed
        if count > landed:
            history = generate(data_dir, clients, count, rate, start=landed, history=history)
            landed = count

    for night in sorted(nights):
        # Two builds before the measured one, as in production, where every night's build
        # follows an incremental one: the first build of a data dir is a full refresh, and the
        # second one pays dbt's parse again (its vars differ: incremental).
        land_to(night - 2)
        if landed:
            measured_build(data_dir)
        land_to(night - 1)
        measured_build(data_dir)  # the warehouse as it stood after night K - 1
        land_to(night)
        seconds, rss = measured_build(data_dir)
        out.append((night, seconds, rss))
        sys.stdout.write(f"clients {clients}, night {night}: build {seconds:.2f} s, peak RSS {rss:.0f} MB\n")
        sys.stdout.flush()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.build", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--night", type=int, action="append", dest="nights")
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    nights = args.nights or [2, 30, 90]
    if args.workdir:
        run(args.clients, nights, args.rate, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="build-bench-") as tmp:
            run(args.clients, nights, args.rate, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
