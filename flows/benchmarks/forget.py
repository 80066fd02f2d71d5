"""Benchmark of ``membersync forget`` in a long history (not a test): the cost of forgetting
follows the identity files, not the history.

    python -m membersync.flows.benchmarks.forget --clients 100000 --nights 365 --forget 1 --forget 100

Lands the synthetic history (:mod:`membersync.flows.benchmarks.synthetic`: the first night every client,
then ``--rate`` of them a day, each with its whole history), builds the warehouse once, then runs
``membersync forget`` as a whole process for each size in turn (other clients each time, seeded),
and reports its wall time and the bytes it wrote (files new after it, under ``landing/`` and the
warehouse's parts) against the landed bytes. ``--workdir DIR`` keeps the landed history for the
next run (landing a year of 100,000 clients takes longer than everything measured).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from membersync.flows.benchmarks.synthetic import generate
from membersync.warehouse.build.builder import build_warehouse, committed_nights
from membersync.warehouse.landing.paths import DataDir


@dataclass(frozen=True)
class Forgotten:
    clients: int
    seconds: float
    bytes_written: int
    landed_bytes: int
    peak_rss_mb: float

    @property
    def share(self) -> float:
        return self.bytes_written / self.landed_bytes if self.landed_bytes else 0.0


def files_of(data_dir: DataDir) -> dict[str, tuple[int, int]]:
    """Every data file (landing and parts): path -> (size, inode), to tell new files from old."""
    out = {}
    for top in (data_dir.landing, data_dir.root / "warehouse" / "parts"):
        for path in top.rglob("*.parquet") if top.is_dir() else ():
            stat = path.stat()
            out[str(path)] = (stat.st_size, stat.st_ino)
    return out


def landed_bytes(data_dir: DataDir) -> int:
    return sum(p.stat().st_size for p in data_dir.landing.rglob("*.parquet") if "_staging" not in p.parts)


def forget(data_dir: DataDir, numbers: list[str], key_file: Path) -> Forgotten:
    """One ``membersync forget`` of ``numbers`` as a whole process: its wall time and bytes written."""
    before = files_of(data_dir)
    landed = landed_bytes(data_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")}
    env.update(MEMBERSYNC_DATA_DIR=str(data_dir.root), MEMBERSYNC_ERASURE_KEY_FILE=str(key_file))
    listing = data_dir.root.parent / f"forget-{len(numbers)}.txt"
    listing.write_text("\n".join(numbers) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "membersync.flows.cli.commands", "forget", "--from-file", str(listing)]
    started = time.monotonic()
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [*command, "--reason", "bench"], env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (KiB on Linux)
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            stderr.seek(0)
            message = stderr.read().decode(errors="replace").strip()[-500:]
            raise RuntimeError(f"forget failed ({proc.returncode}): {message}")
    after = files_of(data_dir)
    written = sum(size for path, (size, inode) in after.items() if before.get(path, (0, -1))[1] != inode)
    return Forgotten(len(numbers), seconds, written, landed, usage.ru_maxrss / 1024)


def already_forgotten(data_dir: DataDir) -> int:
    """Clients the register already holds: a rerun on the same workdir forgets the next ones."""
    register = data_dir.root / "privacy" / "erasures.json"
    if not register.is_file():
        return 0
    return sum(len(e["clients"]) for e in json.loads(register.read_text(encoding="utf-8"))["erasures"])


def run(clients: int, nights: int, rate: float, sizes: list[int], workdir: Path) -> list[Forgotten]:
    data_dir = DataDir(workdir / "data")
    landed = len(committed_nights(data_dir)) if data_dir.manifests.exists() else 0
    if landed < nights:
        history = generate(data_dir, clients, landed, rate, land=False) if landed else None
        generate(data_dir, clients, nights, rate, start=landed, history=history)
    build_warehouse(data_dir)
    pool = [f"{i:06d}" for i in range(1, clients + 1)]
    random.Random(51).shuffle(pool)
    pool = pool[already_forgotten(data_dir) :]
    out = []
    for size in sizes:
        chosen, pool = pool[:size], pool[size:]
        out.append(forget(data_dir, chosen, workdir / "erasure.key"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--forget", type=int, action="append", help="clients to forget (repeat)")
    parser.add_argument("--workdir", type=Path, help="keep (or reuse) the landed history here")
    args = parser.parse_args(argv)
    sizes = args.forget or [1, 100]
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        results = run(args.clients, args.nights, args.rate, sizes, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-forget-") as tmp:
            results = run(args.clients, args.nights, args.rate, sizes, Path(tmp))
    header = (
        "| clients forgotten | wall time (whole process) | peak RSS | bytes written | landed bytes | share |"
    )
    sys.stdout.write(f"{args.clients:,} clients x {args.nights} nights, {args.rate:.0%} a day\n{header}\n")
    sys.stdout.write("|---|---|---|---|---|---|\n")
    for r in results:
        sys.stdout.write(
            f"| {r.clients:,} | {r.seconds:.1f} s | {r.peak_rss_mb:,.0f} MB | "
            f"{r.bytes_written / 1e6:.2f} MB | {r.landed_bytes / 1e6:,.0f} MB | {r.share:.3%} |\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
