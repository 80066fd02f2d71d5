"""Many tenants on a Prefect work pool, and one large tenant in shards (issue 13; not a test).

Real parts on loopback: ``prefect server start``, ``prefect worker`` processes on a process pool,
``membersync deploy`` of a tenants file, one sandbox per tenant (in this process) limited to
``--rate`` requests/s (burst = rate) with ``--latency-ms``; every tenant's night is triggered at
once. Each configuration gets a fresh server, fresh sandboxes and fresh data dirs (local disk:
the data location is not what is measured here)::

    python -m membersync.flows.benchmarks.work_pool tenants --tenants 6 --clients 5000 --workers 1 --workers 3
    python -m membersync.flows.benchmarks.work_pool sharded --clients 20000 --shards 3 --workers 3

The server uses the database ``PREFECT_SERVER_DATABASE_CONNECTION_URL`` names, if set in the
environment: PostgreSQL as in production (``postgresql+asyncpg://...``; on SQLite, several workers
lock the file and the server drops events). Without it, SQLite under a fresh ``PREFECT_HOME``.

Per configuration: the wall time from the trigger to the end of the last night, and per tenant
its requests, the rate its sandbox served (requests per second from its 6th second to its last
full one) as a share of the limit, and its 429 answers. Tenants carry ``rate`` in the tenants
file (a known limit), so every worker running one of them takes the tenant's shared Prefect
rate-limit slots.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.flows.pool.schedule import free_port, server_env, wait_healthy
from membersync.flows.pool.tenant_flow import FLOW_NAME, wait_final

BIN = Path(sys.executable).parent
POOL = "bench-pool"
DEADLINE = 3600.0


@dataclass
class TenantFigures:
    name: str
    clients: int
    requests: int
    served_per_s: float
    refused: int
    state: str


def _start(log: Path, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def served_rate(passed: Counter[int]) -> float:
    """Requests per second from the 6th second to the last full one (the start-up excluded)."""
    seconds = sorted(passed)
    inner = seconds[5:-1]
    return sum(passed[s] for s in inner) / len(inner) if inner else 0.0


def tenants_toml(sandboxes: dict[str, RunningSandbox], data: Path, rate: float, shards: int) -> str:
    parts = []
    for name, sb in sandboxes.items():
        upper = name.upper().replace("-", "_")
        parts.append(
            textwrap.dedent(f"""
            [tenants.{name}]
            base_url = "{sb.url}"
            username_env = "{upper}_USERNAME"
            password_env = "{upper}_PASSWORD"
            data_dir = "{data / name}"
            rate = {rate:g}
            shards = {shards}
            """)
        )
    return "".join(parts)


async def _wait(ids: list[Any]) -> dict[Any, Any]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        runs = await wait_final(client, ids, DEADLINE)
    if not all(r.state is not None and r.state.is_final() for r in runs.values()):
        raise TimeoutError("the nights did not end within the deadline")
    return runs


def run_configuration(
    root: Path, tenants: int, clients: int, workers: int, rate: float, latency_ms: float, shards: int
) -> tuple[float, list[TenantFigures]]:
    """One fresh server, ``workers`` workers, ``tenants`` sandboxes: every night at once."""
    procs: list[subprocess.Popen[bytes]] = []
    names = [f"t{i}" for i in range(1, tenants + 1)]
    sandboxes = _start_sandboxes(names, clients, rate, latency_ms)
    try:
        port = free_port()
        api = f"http://127.0.0.1:{port}/api"
        home = root / "prefect-home"
        procs.append(_start_server(root, port, home))
        wait_healthy(api, 180, procs[0])
        tenants_file = root / "tenants.toml"
        tenants_file.write_text(tenants_toml(sandboxes, root / "data", rate, shards), encoding="utf-8")
        env = _worker_env(api, home, sandboxes)
        deploy = [str(BIN / "membersync"), "deploy", str(tenants_file), "--pool", POOL]
        subprocess.run(deploy, env=env, check=True, capture_output=True, timeout=300)
        for i in range(1, workers + 1):
            procs.append(_start_worker(root, i, env))
        wall, runs = _run_every_night(api, home, names)
        states = {r.name: r.state_type.value for r in runs.values()}
        return wall, [_figures(name, sb, clients, states) for name, sb in sandboxes.items()]
    finally:
        _stop(procs)
        for sb in sandboxes.values():
            sb.stop()


def _start_sandboxes(
    names: list[str], clients: int, rate: float, latency_ms: float
) -> dict[str, RunningSandbox]:
    """One sandbox per tenant, each with its own data (seed) and credentials, limited to ``rate``."""
    return {
        name: start_in_thread(
            SandboxConfig.checked(
                clients=clients,
                seed=200 + i,
                rate=rate,
                latency_ms=latency_ms,
                username=f"{name}-user",
                password=f"{name}-pw-{i}",
                lazy=True,
            )
        )
        for i, name in enumerate(names)
    }


def _start_server(root: Path, port: int, home: Path) -> subprocess.Popen[bytes]:
    server = {**server_env(port), "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server.pop("PREFECT_API_URL", None)
    return _start(root / "server.log", [str(BIN / "prefect"), "server", "start", "--port", str(port)], server)


def _worker_env(api: str, home: Path, sandboxes: dict[str, RunningSandbox]) -> dict[str, str]:
    """The environment of ``membersync deploy`` and the workers: this server, no setting of the
    caller's (PREFECT_*, MEMBERSYNC_*), and every tenant's credentials under the names the
    tenants file gives."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MEMBERSYNC_"))}
    env |= {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "MEMBERSYNC_AUDIT_MAX_REQUESTS": "0",
    }
    for name, sb in sandboxes.items():
        upper = name.upper()
        env[f"{upper}_USERNAME"], env[f"{upper}_PASSWORD"] = sb.config.username, sb.config.password
    return env


def _start_worker(root: Path, i: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--type", "process", "--name", f"w{i}"]
    return _start(root / f"worker-{i}.log", cmd, env)


def _run_every_night(api: str, home: Path, names: list[str]) -> tuple[float, dict[Any, Any]]:
    """Trigger every tenant's night at once; the wall time until the last one ended, and the runs."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api, PREFECT_HOME: str(home)}):
        started = time.monotonic()
        ids = [run_deployment(f"{FLOW_NAME}/{name}", timeout=0).id for name in names]  # type: ignore[union-attr]
        runs = asyncio.run(_wait(ids))
        wall = time.monotonic() - started
    return wall, runs


def _figures(name: str, sb: RunningSandbox, clients: int, states: dict[str, str]) -> TenantFigures:
    passed, refused = Counter(sb.stats.passed_per_second), Counter(sb.stats.refused_per_second)
    return TenantFigures(
        name,
        clients,
        sum(passed.values()),
        served_rate(passed),
        sum(refused.values()),
        states.get(name, "?"),
    )


def report(label: str, wall: float, figures: list[TenantFigures], rate: float) -> None:
    sys.stdout.write(f"{label}: wall {wall:.0f} s\n")
    for f in figures:
        share = f"{f.served_per_s:.1f} req/s = {100 * f.served_per_s / rate:.0f}% of {rate:g}/s"
        sys.stdout.write(
            f"  {f.name}: {f.state}, {f.clients:,} clients, {f.requests:,} requests, {share}, "
            f"{f.refused} x 429\n"
        )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.work_pool", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("kind", choices=["tenants", "sharded"])
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--workers", type=int, action="append")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    for workers in args.workers or [1, 3]:
        with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
            if args.kind == "tenants":
                wall, figures = run_configuration(
                    Path(tmp), args.tenants, args.clients, workers, args.rate, args.latency_ms, 1
                )
                label = f"{args.tenants} tenants x {args.clients:,} clients on {workers} worker(s)"
            else:
                wall, figures = run_configuration(
                    Path(tmp), 1, args.clients, workers, args.rate, args.latency_ms, args.shards
                )
                label = f"1 tenant x {args.clients:,} clients in {args.shards} shards on {workers} worker(s)"
            report(label, wall, figures, args.rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
