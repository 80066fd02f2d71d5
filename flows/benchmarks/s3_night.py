"""A night on S3 with the lease and the open tables: what each adds to the night's wall time.

moto's S3 server (a real HTTP endpoint, its own process) with versioning on, the sandbox on
loopback, and two real nights (``membersync sync``, Prefect off, a child process each: the first
full, the second incremental). From each night's own log: the seconds spent in the lease's
requests and the fence's copies (logged at its release) and in the Delta publication (logged
after the build); from the bucket, the bytes under ``delta/`` against those under ``landing/``;
and the floor any publication with a commit per table has here: as many one-row delta-rs
appends, :data:`TABLES_AT_ONCE` at a time, to tables of the same bucket::

    python -m membersync.flows.benchmarks.s3_night --clients 10000

Goal (issue 62): lease and open tables < 5 % of the night at 10,000 clients.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from membersync.extract.sandbox.running import start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.flows.console import out
from membersync.warehouse.exports.open_tables import TABLES_AT_ONCE
from membersync.warehouse.landing.storage import s3_filesystem

BUCKET = "membersync-bench"
LEASE = re.compile(r"lease of \S+ \(token \d+\): (\d+) fenced write\(s\), ([0-9.]+) s")
OPEN = re.compile(r"open tables: \d+ table\(s\), (\d+) commit\(s\) in ([0-9.]+) s")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _moto(port: int, log: Path) -> subprocess.Popen[bytes]:
    moto = Path(sys.executable).parent / "moto_server"
    process = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    time.sleep(3)
    return process


def _night(env: dict[str, str], night: dt.date, work: Path) -> dict[str, float]:
    started = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "membersync.flows.cli.commands",
        "sync",
        "--date",
        night.isoformat(),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"night {night} failed: {proc.stderr.strip()[-500:]}")
    logs = sorted((work / "logs").glob(f"sync-{night.isoformat()}-*.log"))[-1].read_text(errors="replace")
    lease = [m.groups() for m in LEASE.finditer(logs)]
    opened = [m.groups() for m in OPEN.finditer(logs)]
    return {
        "wall": wall,
        "lease_s": sum(float(s) for _, s in lease),
        "fenced": sum(int(n) for n, _ in lease),
        "open_s": sum(float(s) for _, s in opened),
        "commits": sum(int(n) for n, _ in opened),
    }


def _bytes(prefix: str) -> int:
    fs = s3_filesystem()
    return sum(
        int(info.get("size") or info.get("Size") or 0) for info in fs.find(prefix, detail=True).values()
    )


def _ideal_commits(commits: int) -> float:
    """Seconds for ``commits`` one-row appends to as many existing Delta tables on the bucket."""
    import pyarrow as pa
    from deltalake import write_deltalake

    options = {"AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"], "AWS_ALLOW_HTTP": "true"}
    options["AWS_REGION"] = os.environ["AWS_DEFAULT_REGION"]
    row = pa.table({"night": [dt.date.today()], "value": [1]})
    uris = [f"s3://{BUCKET}/ideal/t{n}" for n in range(commits)]
    for uri in uris:
        write_deltalake(uri, row, storage_options=options)
    started = time.perf_counter()
    with ThreadPoolExecutor(TABLES_AT_ONCE) as pool:
        list(pool.map(lambda uri: write_deltalake(uri, row, mode="append", storage_options=options), uris))
    return time.perf_counter() - started


def run(clients: int) -> int:
    with tempfile.TemporaryDirectory(prefix="membersync-s3-bench-") as tmp:
        port = _free_port()
        moto = _moto(port, Path(tmp) / "moto.log")
        aws = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        os.environ.update(aws)
        fs = s3_filesystem()
        fs.call_s3("create_bucket", Bucket=BUCKET)
        fs.call_s3("put_bucket_versioning", Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        today = dt.date.today()
        sandbox = start_in_thread(SandboxConfig(clients=clients, anchor_date=today))
        try:
            work = Path(tmp) / "work"
            env = {
                **os.environ,
                **aws,
                "MEMBERSYNC_BASE_URL": sandbox.url,
                "MEMBERSYNC_USERNAME": "sandbox",
                "MEMBERSYNC_PASSWORD": "sandbox",
                "MEMBERSYNC_DATA_DIR": f"s3://{BUCKET}/tenant",
                "MEMBERSYNC_CACHE_DIR": str(work),
                "MEMBERSYNC_PREFECT": "off",
                "MEMBERSYNC_ERASURE_KEY_FILE": str(Path(tmp) / "erasure.key"),
            }
            rows = [(n, _night(env, n, work)) for n in (today - dt.timedelta(days=1), today)]
        finally:
            sandbox.stop()
        landed, published = _bytes(f"{BUCKET}/tenant/landing"), _bytes(f"{BUCKET}/tenant/delta")
        floor = _ideal_commits(int(rows[0][1]["commits"]))
        moto.terminate()
    for night, f in rows:
        out.print(
            f"{night}: night {f['wall']:.1f} s; lease {f['lease_s']:.2f} s ({f['fenced']:.0f} fenced writes, "
            f"{100 * f['lease_s'] / f['wall']:.1f} %); open tables {f['open_s']:.2f} s "
            f"({f['commits']:.0f} commits, {100 * f['open_s'] / f['wall']:.1f} %)",
            soft_wrap=True,
        )
    out.print(
        f"floor: {rows[0][1]['commits']:.0f} one-row commits, {TABLES_AT_ONCE} at once: {floor:.2f} s "
        f"({100 * floor / rows[0][1]['wall']:.1f} % of the first night)",
        soft_wrap=True,
    )
    out.print(f"bytes: landing/ {landed:,}, delta/ {published:,} ({100 * published / max(landed, 1):.0f} %)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10000)
    return run(parser.parse_args(argv).clients)


if __name__ == "__main__":
    raise SystemExit(main())
