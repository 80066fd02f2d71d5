"""Our CPU per request as a marginal, and Prefect's fixed cost per night (issue 12).

::

    python -m membersync.flows.benchmarks.cpu marginal --sizes 1000,4000 --runs 3
    python -m membersync.flows.benchmarks.cpu prefect --runs 3 [--prefect-home DIR]
    python -m membersync.flows.benchmarks.cpu profile --sizes 1000,4000 [--out DIR]

``marginal``: for each size, a sandbox of that many clients in its own process and full nights
with Prefect off in child processes (:func:`membersync.flows.benchmarks.sync.run_child`); the marginal CPU
per request is (least CPU of the large night - least CPU of the small) / (request difference),
so fixed costs (imports, start-up, the configuration) cancel.

``prefect``: ``membersync sync`` (the default path, Prefect on; ``MEMBERSYNC_BUILD=off``) on a
20-client sandbox, and the same with ``MEMBERSYNC_PREFECT=off``. Reports the wall time and the
CPU of the whole process tree (the command and its children, e.g. Prefect's server) when the
night's first data request starts (the configuration step), and for the whole command.
``--prefect-home`` reuses one PREFECT_HOME (a warm database, as night after night); without it
each run gets a fresh one (a first night: database migrations included).

``profile``: the same two nights (Prefect off) under py-spy (``record --gil --format raw``: CPU
samples, idle threads left out), so the marginal CPU per request is split by where it is spent
(our module files, each library): :mod:`membersync.flows.benchmarks.flame`. Writes the folded
stacks of both nights and a flame graph (SVG) of the large one to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from membersync.flows.benchmarks import flame
from membersync.flows.benchmarks.sync import PASSWORD, USERNAME, Measured, run_child, sandbox_process
from membersync.warehouse.landing.paths import DEFAULT_DATA_DIR

# Run in the measured `membersync sync` process: records wall time and the process tree's CPU
# when the night's configuration step (its first data request) starts.
_FIRST_REQUEST_HOOK = r"""
import json, os, sys, time
T0 = time.monotonic()
TICK = os.sysconf("SC_CLK_TCK")

def tree_cpu():
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            procs[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]) / TICK)
    cpu, todo = [], [os.getpid()]
    while todo:
        p = todo.pop()
        if p in procs:
            cpu.append(procs[p][1])
        todo.extend(c for c, (pp, _) in procs.items() if pp == p)
    return cpu

from membersync.flows.night import nightly
original = nightly.NightRun.land_config
async def land_config(self):
    cpu = tree_cpu()
    with open(os.environ["CPU_BENCH_OUT_FILE"], "w") as fh:
        json.dump({"wall_s": time.monotonic() - T0, "tree_cpu_s": sum(cpu), "per_process": cpu}, fh)
    return await original(self)
nightly.NightRun.land_config = land_config
sys.argv = ["membersync", "sync", "--no-progress"]
from membersync.flows.cli.commands import main
main()
"""


def marginal(sizes: list[int], runs: int) -> float:
    best: dict[int, Measured] = {}
    for size in sizes:
        with sandbox_process(size) as url:
            for _ in range(runs):
                got = run_child(url, prefect=False, timeout=6 * 3600)
                print(  # noqa: T201 - a benchmark's report
                    f"{size:,} clients: {got.requests:,} requests, {got.cpu_s:.2f} s CPU, "
                    f"{got.wall_s:.1f} s wall, peak RSS {got.peak_rss_mb:,.0f} MB"
                )
                if size not in best or got.cpu_s < best[size].cpu_s:
                    best[size] = got
    small, large = best[sizes[0]], best[sizes[-1]]
    per_request = 1000 * (large.cpu_s - small.cpu_s) / (large.requests - small.requests)
    print(  # noqa: T201
        f"marginal CPU per request {sizes[0]:,} -> {sizes[-1]:,} clients (least of {runs}): "
        f"{per_request:.3f} ms"
    )
    return per_request


def _py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: pip install py-spy (it is in the dev extras)")
    return found


def profile(sizes: list[int], rate_hz: int, out_dir: Path) -> list[flame.Marginal]:
    """Each place's marginal CPU per request between the smallest and the largest night size."""
    spy = _py_spy()
    out_dir.mkdir(parents=True, exist_ok=True)
    nights: list[tuple[Measured, flame.Stacks]] = []
    for size in (sizes[0], sizes[-1]):
        folded = out_dir / f"night-{size}.folded"
        record = [spy, "record", "--gil", "--format", "raw", f"--rate={rate_hz}", f"--output={folded}", "--"]
        with sandbox_process(size) as url:
            got = run_child(url, prefect=False, timeout=6 * 3600, wrapper=record)
        stacks = flame.parse_folded(folded.read_text())
        samples = sum(stacks.values())
        print(  # noqa: T201 - a benchmark's report
            f"{size:,} clients: {got.requests:,} requests, {got.cpu_s:.2f} s CPU in the night; "
            f"{samples:,} samples = {samples / rate_hz:.2f} s CPU with start-up ({folded})"
        )
        nights.append((got, stacks))
    (small, small_stacks), (large, large_stacks) = nights
    extra = large.requests - small.requests
    rows = flame.marginal(flame.self_samples(small_stacks), flame.self_samples(large_stacks), rate_hz, extra)
    sampled = sum(row.ms_per_request for row in rows)
    measured = 1000 * (large.cpu_s - small.cpu_s) / extra
    print(  # noqa: T201
        f"\nmarginal CPU per request {sizes[0]:,} -> {sizes[-1]:,} clients: {sampled:.3f} ms sampled, "
        f"{measured:.3f} ms measured (process CPU, one run each, under the profiler)\n"
    )
    print("| where (leaf frame) | ms per request | share |\n|---|---:|---:|")  # noqa: T201
    for row in rows:
        if abs(row.ms_per_request) >= 0.001:
            print(f"| {row.place} | {row.ms_per_request:.3f} | {100 * row.ms_per_request / sampled:.0f} % |")  # noqa: T201
    ours = [
        row
        for row in flame.marginal(
            flame.inclusive_samples(small_stacks), flame.inclusive_samples(large_stacks), rate_hz, extra
        )
        if flame.is_ours(row.place) and not flame.frame_file(row.place).startswith("flows/benchmarks/")
    ]
    print("\n| our function (with what it calls) | ms per request |\n|---|---:|")  # noqa: T201
    for row in ours[:15]:
        print(f"| {row.place} | {row.ms_per_request:.3f} |")  # noqa: T201
    svg = out_dir / f"night-{sizes[-1]}.svg"
    title = f"membersync night, {sizes[-1]:,} clients, Prefect off, CPU (py-spy --gil)"
    svg.write_text(flame.flame_svg(large_stacks, title))
    print(f"\nflame graph: {svg}")  # noqa: T201
    return rows


def prefect_fixed(runs: int, prefect_home: str | None) -> None:
    with sandbox_process(20) as url:
        for mode in ("on", "off"):
            for _ in range(runs):
                with tempfile.TemporaryDirectory(prefix="membersync-cpu-bench-") as tmp:
                    out = Path(tmp) / "first.json"
                    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
                    env.update(
                        MEMBERSYNC_BASE_URL=url,
                        MEMBERSYNC_USERNAME=USERNAME,
                        MEMBERSYNC_PASSWORD=PASSWORD,
                        MEMBERSYNC_DATA_DIR=str(Path(tmp) / "data"),
                        MEMBERSYNC_BUILD="off",
                        MEMBERSYNC_PREFECT=mode,
                        CPU_BENCH_OUT_FILE=str(out),
                        PREFECT_HOME=prefect_home or str(Path(tmp) / "prefect"),
                    )
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    started = time.monotonic()
                    proc = subprocess.run(
                        [sys.executable, "-c", _FIRST_REQUEST_HOOK], env=env, capture_output=True, text=True
                    )
                    wall = time.monotonic() - started
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if proc.returncode != 0:
                        raise RuntimeError(f"sync failed ({proc.returncode}): {proc.stderr[-800:]}")
                    first = json.loads(out.read_text())
                    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                    print(  # noqa: T201
                        f"Prefect {mode}: before the first request {first['wall_s']:.1f} s wall, "
                        f"{first['tree_cpu_s']:.2f} s CPU (per process: "
                        f"{', '.join(f'{c:.2f}' for c in first['per_process'])}); whole command "
                        f"{wall:.1f} s wall, {cpu:.2f} s CPU"
                    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.cpu")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("marginal", help="marginal CPU per request between night sizes, Prefect off")
    m.add_argument("--sizes", default="1000,4000")
    m.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("prefect", help="Prefect's fixed cost before the first request")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--prefect-home", default=None)
    f = sub.add_parser("profile", help="the marginal CPU per request by where it is spent (py-spy)")
    f.add_argument("--sizes", default="1000,4000")
    f.add_argument("--rate", type=int, default=250, help="samples per second")
    f.add_argument("--out", type=Path, default=DEFAULT_DATA_DIR / "profile", help="where the stacks go")
    args = parser.parse_args(argv)
    if args.command == "marginal":
        marginal([int(s) for s in args.sizes.split(",")], args.runs)
    elif args.command == "profile":
        profile([int(s) for s in args.sizes.split(",")], args.rate, args.out)
    else:
        prefect_fixed(args.runs, args.prefect_home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
