"""Measure our CPU per request with each httpx transport (the default is picked on this).

Run ``python -m membersync.flows.benchmarks.transport [--requests N] [--concurrency C] [--repeats R]``.

A small aiohttp server in a *separate process* answers a typical JSON list (a client's
memberships, ~1 KB) on loopback, so the CPU time measured (``time.process_time`` of this
process) is the client's alone: httpx + transport + (for the ``client`` rows) our
ServiceClient's limiter, retry loop, orjson parse and unwrap.

Figures measured on the shared 2-core build machine (3,000 requests, concurrency 8, median
of 3; two runs, load average 3-5 from other work, so absolute values are inflated)::

    transport                          raw httpx ms CPU/req   ServiceClient ms CPU/req
    httpx (AsyncHTTPTransport)            2.5 - 3.2              2.5 - 2.9
    httpx_aiohttp.AiohttpTransport        0.88 - 0.95            0.73 - 0.77

The aiohttp transport costs about a third of httpx's own; our ServiceClient (limits, retry
loop, orjson, unwrap) costs *less* than plain ``httpx.AsyncClient.get(params=...)`` because it
encodes the query once and skips httpx's per-response cookie jar. Hence
``ClientOptions.transport = "aiohttp"`` by default. A run prints its figures (and
:func:`measure` returns them).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import time
from typing import Any

import httpx
import orjson

logger = logging.getLogger(__name__)

PAYLOAD = orjson.dumps(
    {
        "memberships": [
            {
                "membershipId": f"M{i:07d}",
                "membershipTypeId": "EFT-GOLD",
                "name": "Gold EFT",
                "isEft": True,
                "status": "Active",
                "storecode": "DOWNTOWN  ",
                "startDate": "2024-01-15",
                "endDate": None,
                "drawDay": 15,
                "monthlyDues": "79.00",
                "price": None,
                "freezeStartDate": None,
                "freezeEndDate": None,
                "cancelDate": None,
                "lastModified": "2025-01-01T10:00:00Z",
            }
            for i in range(3)
        ]
    }
)


def _serve(port_queue: Any) -> None:  # runs in the child process
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=PAYLOAD, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        port_queue.put(port)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _run_raw(transport: httpx.AsyncBaseTransport, url: str, n: int, concurrency: int) -> float:
    async with httpx.AsyncClient(transport=transport, auth=httpx.BasicAuth("bench", "bench")) as http:
        await http.get(url, params={"clientNumber": "000001"})  # warm the connection
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                r = await http.get(url, params={"clientNumber": f"{i:06d}"})
                orjson.loads(r.content)

        cpu = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        return (time.process_time() - cpu) / n


async def _run_client(transport: httpx.AsyncBaseTransport, base: str, n: int, concurrency: int) -> float:
    from membersync.extract.client import ClientOptions, ServiceClient

    options = ClientOptions(max_concurrency=concurrency, initial_concurrency=concurrency)
    async with ServiceClient(base, "bench", "bench", transport=transport, options=options) as client:
        await client.clientmemberships("000001")
        cpu = time.process_time()
        await asyncio.gather(*(client.clientmemberships(f"{i:06d}") for i in range(n)))
        return (time.process_time() - cpu) / n


def _transports(concurrency: int) -> dict[str, Any]:
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return {
        "httpx": lambda: httpx.AsyncHTTPTransport(limits=limits),
        "aiohttp": lambda: AiohttpTransport(limits=limits),
    }


def measure(requests: int = 3000, concurrency: int = 8, repeats: int = 3) -> dict[str, dict[str, float]]:
    """ms of CPU per request: ``{transport: {"raw": ..., "client": ...}}`` (median of ``repeats``)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    server = ctx.Process(target=_serve, args=(queue,), daemon=True)
    server.start()
    try:
        port = queue.get(timeout=30)
        base = f"http://127.0.0.1:{port}"
        url = base + "/svcapi/clients/clientmemberships"
        results: dict[str, dict[str, float]] = {}
        for name, make in _transports(concurrency).items():
            raw = [asyncio.run(_run_raw(make(), url, requests, concurrency)) for _ in range(repeats)]
            ours = [asyncio.run(_run_client(make(), base, requests, concurrency)) for _ in range(repeats)]
            results[name] = {"raw": 1000 * statistics.median(raw), "client": 1000 * statistics.median(ours)}
        return results
    finally:
        server.terminate()
        server.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.transport", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = measure(args.requests, args.concurrency, args.repeats)
    lines = [f"{'transport':<10} {'raw httpx ms CPU/req':>22} {'ServiceClient ms CPU/req':>26}"]
    for name, r in results.items():
        lines.append(f"{name:<10} {r['raw']:>22.3f} {r['client']:>26.3f}")
    import sys

    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
