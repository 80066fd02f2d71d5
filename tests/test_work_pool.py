"""Issue 13 part 3: many tenants on a Prefect work pool, one shared rate limit per tenant.

Real parts on loopback: one ``prefect server start`` with basic auth, two ``prefect worker``
processes on a process pool, ``membersync deploy``, one sandbox per tenant (each with its own
credentials and rate limit). Every tenant's reports equal its sandbox's truth; a tenant with
wrong credentials fails alone; each sandbox's counters show its limit held (no 429), and two
processes sharing a tenant's Prefect rate limit stay under it together (without it: 429s).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from membersync.extract.sandbox.server import RunningSandbox
from membersync.flows.schedule import free_port, server_env, wait_healthy
from membersync.flows.tenant_flow import FLOW_NAME, bucket_size, chunk_for, rate_limit_name
from membersync.warehouse.paths import DataDir
from truth import assert_night_exact

BIN = Path(sys.executable).parent
NIGHT = dt.datetime.now(dt.UTC).date()
AUTH = "ops:correct-horse-battery"
POOL = "tenants-pool"
RATE = 25.0
TENANTS = {"alpha": 30, "beta": 24}  # name -> clients
DEADLINE = 420.0  # seconds for every run to finish


class Procs:
    """Processes this test started (each in its own session), stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.started.append((proc, log))
        return proc

    def tail(self) -> str:
        parts = []
        for proc, log in self.started:
            text = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            parts.append(f"--- {log.name} (pid {proc.pid}, rc {proc.poll()}):\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        for proc, _ in reversed(self.started):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc, _ in self.started:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    logs = tmp_path / "logs"
    logs.mkdir()
    running = Procs(logs)
    try:
        yield running
    finally:
        running.stop()


def tenants_toml(sandboxes: dict[str, RunningSandbox], root: Path) -> str:
    parts = ['[defaults]\nschedule = "0 2 * * *"\ntimezone = "Europe/Paris"\n']
    for name, sb in [*sandboxes.items(), ("gamma", sandboxes["alpha"])]:
        upper = name.upper()
        parts.append(
            textwrap.dedent(f"""
            [tenants.{name}]
            base_url = "{sb.url}"
            username_env = "{upper}_USERNAME"
            password_env = "{upper}_PASSWORD"
            data_dir = "{root / "data" / name}"
            rate = {RATE:g}
            """)
        )
    return "".join(parts)


def per_second(sb: RunningSandbox) -> tuple[Counter[int], Counter[int]]:
    return Counter(sb.stats.passed_per_second), Counter(sb.stats.refused_per_second)


def busy_rate(passed: Counter[int]) -> float:
    """Requests per second over the seconds between the first and the last full one."""
    seconds = sorted(passed)
    inner = seconds[1:-1]
    return sum(passed[s] for s in inner) / len(inner) if inner else 0.0


async def wait_runs(ids: list[Any]) -> dict[Any, Any]:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + DEADLINE
    async with get_client() as client:
        while True:
            runs = {i: await client.read_flow_run(i) for i in ids}
            if all(r.state is not None and r.state.is_final() for r in runs.values()):
                return runs
            if time.monotonic() > deadline:
                return runs
            await asyncio.sleep(2)


GATE_SCRIPT = """
import asyncio, os, sys
from membersync.extract.client import ClientOptions, ServiceClient
from membersync.flows.tenant_flow import SharedRateGate, chunk_for, rate_limit_name

async def main(gated, n, rate):
    gate = SharedRateGate(rate_limit_name("alpha"), chunk_for(rate)) if gated else None
    opts = ClientOptions(gate=gate, adaptive=False, max_concurrency=8, max_retries=0)
    client = ServiceClient(os.environ["GATE_URL"], os.environ["ALPHA_USERNAME"],
                           os.environ["ALPHA_PASSWORD"], options=opts)
    async with client:
        results = await asyncio.gather(*(client.storelist() for _ in range(n)), return_exceptions=True)
    failed = sum(isinstance(r, Exception) for r in results)
    sys.stdout.write(f"{failed} {gate.acquisitions if gate else 0}\\n")

asyncio.run(main(sys.argv[1] == "gated", int(sys.argv[2]), float(sys.argv[3])))
"""


def run_pair(env: dict[str, str], gated: bool, n: int) -> list[str]:
    """Two processes sending ``n`` requests each to tenant alpha's sandbox at once."""
    cmd = [sys.executable, "-c", GATE_SCRIPT, "gated" if gated else "free", str(n), f"{RATE:g}"]
    pair = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = []
    for p in pair:
        out, errout = p.communicate(timeout=120)
        assert p.returncode == 0, errout.decode()[-2000:]
        outs.append(out.decode().strip())
    return outs


def test_shared_rate_gate_takes_slots_in_chunks() -> None:
    from membersync.flows.tenant_flow import SharedRateGate

    taken: list[int] = []

    async def acquire(slots: int) -> None:
        await asyncio.sleep(0.01)
        taken.append(slots)

    async def main() -> None:
        gate = SharedRateGate("membersync-rate-x", 10, acquire)
        await asyncio.gather(*(gate() for _ in range(95)))
        assert gate.acquisitions == 10

    asyncio.run(main())
    assert taken == [10] * 10
    assert [chunk_for(r) for r in (0.5, 4, 25, 100, 1000)] == [1, 1, 6, 25, 50]
    assert bucket_size(0.5) == 2 and bucket_size(100) == 50


@pytest.mark.slow
def test_tenants_on_a_work_pool(
    tmp_path: Path, procs: Procs, fresh_sandbox: Callable[..., RunningSandbox]
) -> None:
    started = time.monotonic()
    sandboxes = {
        name: fresh_sandbox(
            clients=clients,
            seed=100 + i,
            anchor_date=NIGHT,
            rate=RATE,
            username=f"{name}-user",
            password=f"{name}-secret-{i}",
        )
        for i, (name, clients) in enumerate(TENANTS.items())
    }
    tenants_file = tmp_path / "tenants.toml"
    tenants_file.write_text(tenants_toml(sandboxes, tmp_path), encoding="utf-8")

    # -- the Prefect server, with basic auth ------------------------------------------------------
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    home = tmp_path / "prefect-home"
    base = {
        **server_env(port),
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_API_AUTH_STRING": AUTH,
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    base.pop("PREFECT_API_URL", None)
    server = procs.start(
        "server",
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        base,
    )
    wait_healthy(api, 180, server)
    refused = httpx.post(f"{api}/flows/filter", json={}, timeout=10)
    assert refused.status_code == 401, refused.text
    wrong = httpx.post(f"{api}/flows/filter", json={}, auth=("ops", "wrong"), timeout=10)
    assert wrong.status_code == 401
    user, password = AUTH.split(":", 1)
    assert httpx.post(f"{api}/flows/filter", json={}, auth=(user, password), timeout=10).status_code == 200
    server_up = time.monotonic() - started

    # -- workers and the CLI: the server's address and auth; the tenants' credentials --------------
    creds = {}
    for name, sb in sandboxes.items():
        creds[f"{name.upper()}_USERNAME"] = sb.config.username
        creds[f"{name.upper()}_PASSWORD"] = sb.config.password
    creds["GAMMA_USERNAME"] = sandboxes["alpha"].config.username
    creds["GAMMA_PASSWORD"] = "not-the-password"  # gamma's night fails (401); the others must not
    client_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MEMBERSYNC_"))},
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_API_AUTH_STRING": AUTH,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "MEMBERSYNC_AUDIT_MAX_REQUESTS": "0",
        **creds,
    }
    no_auth = {k: v for k, v in client_env.items() if k != "PREFECT_API_AUTH_STRING"}
    denied = subprocess.run(
        [str(BIN / "membersync"), "deploy", str(tenants_file), "--pool", POOL],
        env=no_auth,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert denied.returncode == 1 and "401" in denied.stderr, denied.stderr
    deployed = subprocess.run(
        [str(BIN / "membersync"), "deploy", str(tenants_file), "--pool", POOL],
        env=client_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    for secret in creds.values():
        assert secret not in deployed.stdout + deployed.stderr
    for i in (1, 2):
        procs.start(
            f"worker-{i}",
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--type", "process", "--name", f"w{i}"],
            client_env,
        )

    # -- one run of each deployment now ----------------------------------------------------------------
    from prefect.deployments import run_deployment
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        PREFECT_HOME,
        temporary_settings,
    )

    names = [*TENANTS, "gamma"]
    triggered = time.monotonic()
    settings = {PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: AUTH, PREFECT_HOME: str(home)}
    with temporary_settings(updates=settings):
        ids = [
            run_deployment(f"{FLOW_NAME}/{name}", parameters={"night": NIGHT.isoformat()}, timeout=0).id  # type: ignore[union-attr]
            for name in names
        ]
        runs = asyncio.run(wait_runs(ids))
        nights_wall = time.monotonic() - triggered
        by_name = {r.name: r for r in runs.values()}
        states = {name: (by_name[name].state_type.value if name in by_name else "?") for name in names}
        assert states == {"alpha": "COMPLETED", "beta": "COMPLETED", "gamma": "FAILED"}, (
            f"{states}\n{procs.tail()}"
        )
        # every run on the pool, by the tenant's name, parameters = the name and the night only
        for name in names:
            run = by_name[name]
            assert run.work_pool_name == POOL
            assert run.parameters == {"tenant": name, "night": NIGHT.isoformat()}
            assert f"tenant:{name}" in run.tags
        params = json.dumps([r.parameters for r in runs.values()])
        assert not any(secret in params for secret in creds.values())

    # -- exact reports; each sandbox's limit held (no 429; per-second counts) -----------------------
    figures = {}
    for name, sb in sandboxes.items():
        assert_night_exact(sb, DataDir(tmp_path / "data" / name), NIGHT)
        passed, refused_s = per_second(sb)
        assert sum(refused_s.values()) == 0, f"{name}: 429s at the sandbox {dict(refused_s)}"
        peak = max(passed.values())
        assert peak <= RATE + max(RATE, 1), f"{name}: {peak} requests in one second"
        figures[name] = (sum(passed.values()), peak, round(busy_rate(passed), 1))

    # -- two processes on tenant alpha's shared rate limit: together under it --------------------------
    sb = sandboxes["alpha"]
    pair_env = {**client_env, "GATE_URL": sb.url}
    n = 100
    before_p, before_r = per_second(sb)
    gated = run_pair(pair_env, gated=True, n=n)
    after_p, after_r = per_second(sb)
    gated_passed, gated_refused = after_p - before_p, after_r - before_r
    assert [line.split()[0] for line in gated] == ["0", "0"], gated
    assert sum(gated_passed.values()) == 2 * n
    assert sum(gated_refused.values()) == 0, f"429s with the shared limit: {dict(gated_refused)}"
    gated_rate = busy_rate(gated_passed)
    assert gated_rate <= RATE * 1.05, f"{gated_rate} req/s > {RATE}"
    time.sleep(2)  # the sandbox's bucket refills
    before_p, before_r = per_second(sb)
    run_pair(pair_env, gated=False, n=n)
    free_refused = sum((per_second(sb)[1] - before_r).values())
    assert free_refused > 0, "without the shared limit two processes should exceed the sandbox's limit"

    sys.stderr.write(
        f"\nwork pool: server up {server_up:.1f} s, 3 runs on 2 workers {nights_wall:.1f} s, "
        f"total {time.monotonic() - started:.1f} s; per tenant (requests, peak/s, busy req/s): {figures}; "
        f"2 processes sharing {rate_limit_name('alpha')} (chunk {chunk_for(RATE)}, bucket "
        f"{bucket_size(RATE)}): {gated_rate:.1f} req/s, 0 refused, peak {max(gated_passed.values())}/s, "
        f"acquisitions {[line.split()[1] for line in gated]}; unshared: {free_refused} refused\n"
    )
