"""Benchmark of one night's warehouse build as history accumulates (not a test).

For each night K asked, the synthetic history (:mod:`membersync.flows.benchmarks.synthetic`) is landed up
to night K - 2 and built, then night K - 1 and built (neither measured: the second is incremental,
as every production build after the first), then night K is landed and **its** build is measured
in a child process: wall time, peak RSS (the child's own ``VmHWM``: Python, DuckDB and dbt
included) and the build's phases.

    python -m membersync.flows.benchmarks.build --clients 5000 --night 2 --night 30 --night 90

``--workdir DIR --more K`` continues the history a previous run landed in ``DIR`` (same clients,
rate and seed): it brings the warehouse up to date (not measured: a changed SQL project is a full
refresh), then lands and measures K more nights. A night-365 figure at 100,000 clients then costs
minutes instead of landing a year again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from membersync.flows.benchmarks.synthetic import History, generate
from membersync.warehouse.build.builder import committed_nights
from membersync.warehouse.landing.paths import DataDir

# The child reports its own peak RSS: VmHWM of its address space after exec. (wait4's ru_maxrss
# would not do: Linux carries the high-water mark of the forking parent's memory over exec, and
# this parent holds the whole synthetic history: it inflated every figure before 2026-11-23.)
CHILD = (
    "import json, sys\n"
    "from membersync.warehouse.build.builder import build_warehouse\n"
    "from membersync.warehouse.landing.paths import DataDir\n"
    "result = build_warehouse(DataDir(__import__('pathlib').Path(sys.argv[1])))\n"
    "status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
    "sys.stdout.write(json.dumps({'peak_kb': int(status), 'phases': result.phases}) + '\\n')\n"
)


def measured_build(data_dir: DataDir) -> tuple[float, float, dict[str, float]]:
    """Seconds, peak RSS (MB) and the build's phases (s) of one build in a child process."""
    started = time.monotonic()
    command = [sys.executable, "-c", CHILD, str(data_dir.root)]
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"build failed with exit code {proc.returncode}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return seconds, report["peak_kb"] / 1024, report["phases"]


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
        out.append(_measure(data_dir, clients, night))
    return out


def _measure(data_dir: DataDir, clients: int, night: int) -> tuple[int, float, float]:
    seconds, rss, phases = measured_build(data_dir)
    shown = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
    figures = f"build {seconds:.2f} s, peak RSS {rss:.0f} MB ({shown})"
    sys.stdout.write(f"clients {clients}, night {night}: {figures}\n")
    sys.stdout.flush()
    return night, seconds, rss


def run_more(clients: int, more: int, rate: float, workdir: Path) -> list[tuple[int, float, float]]:
    data_dir = DataDir(workdir / "data")
    landed = len(committed_nights(data_dir))
    if not landed:
        raise SystemExit(f"--more: {data_dir.root} holds no landed history to continue")
    history = generate(data_dir, clients, landed, rate, land=False)  # replayed, not written
    measured_build(data_dir)
    out = []
    for night in range(landed, landed + more):
        history = generate(data_dir, clients, night + 1, rate, start=night, history=history)
        out.append(_measure(data_dir, clients, night))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.build", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--night", type=int, action="append", dest="nights")
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--more", type=int, default=0, help="continue --workdir's history by this many nights"
    )
    args = parser.parse_args(argv)
    if args.more:
        if not args.workdir:
            parser.error("--more needs --workdir (the history to continue)")
        run_more(args.clients, args.more, args.rate, args.workdir)
        return 0
    nights = args.nights or [2, 30, 90]
    if args.workdir:
        run(args.clients, nights, args.rate, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="build-bench-") as tmp:
            run(args.clients, nights, args.rate, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
