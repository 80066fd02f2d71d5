"""Doubles for the client's tests: options on a fake clock, a ``MockTransport`` client with
scripted answers, and a tiny TCP server that misbehaves on purpose (refuses, hangs up, stalls)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
from fake_time import FakeTime
from membersync.extract.client import ClientOptions, ServiceClient

USER, PASSWORD = "svc-user", "s3cret-PW/+x"


def options(t: FakeTime, **kw: Any) -> ClientOptions:
    base: dict[str, Any] = {
        "clock": t.clock,
        "wall_clock": t.wall,
        "sleep": t.sleep,
        "rand": lambda: 0.5,
        "max_retries": 3,
    }
    base.update(kw)
    return ClientOptions(**base)


Handler = Callable[[httpx.Request], httpx.Response]


def mock_client(handler: Handler, t: FakeTime, **kw: Any) -> ServiceClient:
    return ServiceClient(
        "http://svc.test", USER, PASSWORD, transport=httpx.MockTransport(handler), options=options(t, **kw)
    )


def scripted(*responses: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    """A handler answering with ``responses`` in turn (the last one repeats); records requests."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses[min(len(seen), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return handler, seen


def ok(body: Any) -> httpx.Response:
    return httpx.Response(200, content=orjson.dumps(body))


def err(status: int, code: str = "failed", message: str = "it failed", **headers: str) -> httpx.Response:
    return httpx.Response(
        status, content=orjson.dumps({"error": {"code": code, "message": message}}), headers=headers
    )


STORES = ok({"stores": [{"storecode": "DOWNTOWN  ", "name": "Downtown"}]})


PAYMENT = ok({"paymentId": "P1"})


async def call_get(client: ServiceClient) -> Any:
    async with client:
        return await client.storelist()


async def call_post(client: ServiceClient) -> Any:
    async with client:
        return await client.insert_payment(receiptNumber="R1", paymentType="CASH", amount="10.00")


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


class RawServer:
    """A tiny asyncio TCP server with scripted misbehaviour; counts the requests it read."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                self.requests += 1
                if self.behaviour == "close":  # read the request, answer nothing, hang up
                    break
                if self.behaviour == "stall":  # never answer
                    await asyncio.sleep(3600)
                if self.behaviour == "partial":  # promise 100 bytes, send 10, hang up
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                    )
                    writer.write(b'{"stores":')
                    await writer.drain()
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


TRANSPORTS = ["aiohttp", "httpx"]
