"""The sandbox's own throughput: it must never be the bottleneck of our benchmarks.

:func:`run_sandbox_bench` starts ``membersync sandbox`` in a subprocess pinned to one core,
times how long it takes to answer, then drives ``clients/clientdetails`` GETs from a load
generator in another process (pinned to another core when there is one) over keep-alive
connections, and reports requests/s and latency percentiles. No external tool needed (wrk
gives the same picture; see the report of the sandbox engineer).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from membersync.flows.pool.schedule import free_port, stop_process

USERNAME = PASSWORD = "sandbox"


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return []


def _auth_header() -> str:
    return "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()


def _get(url: str, timeout: float = 5.0) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": _auth_header()})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return bytes(answer.read())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _wait_until_up(url: str, process: subprocess.Popen[bytes], limit: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        if process.poll() is not None:
            raise RuntimeError(f"the sandbox exited with code {process.returncode} before answering")
        try:
            _get(url + "/svcapi/stores/storelist", timeout=1.0)
            return time.perf_counter() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    raise RuntimeError(f"the sandbox did not answer within {limit:.0f} s")


def _client_numbers(url: str, count: int = 1000) -> list[str]:
    import orjson

    numbers: list[str] = []
    page = 1
    while len(numbers) < count:
        body = orjson.loads(
            _get(f"{url}/svcapi/clients/search?modifiedSince=2000-01-01T00:00:00Z&pageSize=500&page={page}")
        )
        numbers += [c["clientNumber"] for c in body["clients"]]
        if page * 500 >= body["totalCount"]:
            break
        page += 1
    return numbers[:count]


def _load(
    url: str, numbers: list[str], seconds: float, concurrency: int, cpu: int | None, server_pid: int, out: Any
) -> None:
    """The load generator (child process): GET clientdetails as fast as the server answers."""
    if cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu})
    out.put(asyncio.run(_drive(url, numbers, seconds, concurrency, server_pid)))


async def _drive(
    url: str, numbers: list[str], seconds: float, concurrency: int, server_pid: int
) -> dict[str, Any]:
    import aiohttp

    headers = {"Authorization": _auth_header()}
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, headers=headers, connector=connector) as session:

        async def worker(offset: int, deadline: float, record: bool) -> None:
            nonlocal errors
            i = offset
            while time.perf_counter() < deadline:
                number = numbers[i % len(numbers)]
                i += concurrency
                sent = time.perf_counter()
                async with session.get("/svcapi/clients/clientdetails", params={"clientNumber": number}) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                if record:
                    latencies.append(time.perf_counter() - sent)

        warm = time.perf_counter() + min(1.0, seconds / 5)
        await asyncio.gather(*(worker(k, warm, False) for k in range(concurrency)))
        out_of_window = errors
        cpu_before = _cpu_seconds(server_pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker(k, started + seconds, True) for k in range(concurrency)))
        elapsed = time.perf_counter() - started
        server_cpu = _cpu_seconds(server_pid) - cpu_before
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(n / elapsed, 1) if elapsed else 0.0,
        "p50_ms": round(latencies[n // 2] * 1000, 2) if n else None,
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1000, 2) if n else None,
        "errors": errors - out_of_window,
        "server_cpu_s": round(server_cpu, 2),
        "requests_per_server_cpu_s": round(n / server_cpu, 1) if server_cpu > 0 else None,
    }


def run_sandbox_bench(
    clients: int = 100_000, seconds: float = 10, *, concurrency: int = 16, startup_limit: float = 120
) -> dict[str, Any]:
    """Start-up seconds, requests/s and p50/p99 latency of ``clients/clientdetails`` on one core."""
    cpus = _cpus()
    server_cpu = cpus[0] if cpus else None
    load_cpu = cpus[1] if len(cpus) > 1 else None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-c", "from membersync.flows.cli.commands import main; main()",
        "sandbox", "--port", str(port), "--clients", str(clients),
    ]  # fmt: skip

    def pin() -> None:  # runs in the child before exec
        if server_cpu is not None:
            os.sched_setaffinity(0, {server_cpu})

    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin if cpus else None
    )
    try:
        startup = _wait_until_up(url, process, startup_limit)
        startup_cpu = _cpu_seconds(process.pid)
        numbers = _client_numbers(url)
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(
            target=_load, args=(url, numbers, seconds, concurrency, load_cpu, process.pid, queue)
        )
        child.start()
        result = queue.get(timeout=seconds + 120)
        child.join(30)
    finally:
        stop_process(process, grace=15.0)
    # On a shared machine the server may not get a whole core: requests per second of the server's
    # own CPU time says what one whole core would serve.
    return {
        "clients": clients,
        "startup_s": round(startup, 2),
        "startup_cpu_s": round(startup_cpu, 2),
        "server_cpu": server_cpu,
        "load_cpu": load_cpu,
        "concurrency": concurrency,
        **result,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m membersync.flows.benchmarks.sandbox [clients] [seconds]``: the figures as JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.sandbox", description=__doc__.splitlines()[0]
    )
    parser.add_argument("clients", type=float, nargs="?", default=100_000, help="default 100,000")
    parser.add_argument("seconds", type=float, nargs="?", default=10.0, help="measured seconds (default 10)")
    args = parser.parse_args(argv)
    figures = run_sandbox_bench(int(args.clients), args.seconds)
    sys.stdout.write(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
