"""The client on real sockets, both transports (aiohttp and httpx): a refused connection, a
dropped one, a server that never answers, and the canary password absent from every log and
error. The servers are small asyncio TCP servers on loopback (``client_doubles.RawServer``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, quote_plus

import orjson
import pytest
from client_doubles import PASSWORD, TRANSPORTS, USER, RawServer, call_get, call_post, options, run
from fake_time import FakeTime
from membersync.extract import errors, redact
from membersync.extract.client import ServiceClient
from membersync.flows.pool.schedule import free_port


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_refused_connection_is_a_connect_error_and_retried_even_for_a_write(transport: str) -> None:
    t = FakeTime()
    opts = options(t, transport=transport, max_retries=2)
    client = ServiceClient(f"http://127.0.0.1:{free_port()}", USER, PASSWORD, options=opts)
    with pytest.raises(errors.ConnectError) as info:
        run(call_post(client))
    assert client.stats.requests == 3 and client.stats.retries == 2
    assert info.value.endpoint == "insert_payment" and info.value.status is None


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("behaviour", ["close", "partial"])
def test_dropped_connection_retried_for_a_read_never_for_a_write(transport: str, behaviour: str) -> None:
    async def scenario(call: Callable[[ServiceClient], Awaitable[Any]]) -> tuple[errors.ServiceError, int]:
        t = FakeTime()
        raw = RawServer(behaviour)
        async with raw as url:
            client = ServiceClient(
                url, USER, PASSWORD, options=options(t, transport=transport, max_retries=2)
            )
            with pytest.raises(errors.ServiceError) as info:
                await call(client)
        return info.value, raw.requests

    read_error, read_requests = run(scenario(call_get))
    assert isinstance(read_error, errors.ConnectionDropped), repr(read_error)
    assert read_requests >= 3  # retried (aiohttp may add its own one retry of a reused connection)
    write_error, write_requests = run(scenario(call_post))
    assert isinstance(write_error, errors.ConnectionDropped), repr(write_error)
    assert write_requests == 1  # the server got the write once: never sent again
    assert write_error.attempts == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_server_that_never_answers_is_a_read_timeout(transport: str) -> None:
    async def scenario(call: Callable[[ServiceClient], Awaitable[Any]]) -> tuple[errors.ServiceError, int]:
        t = FakeTime()
        raw = RawServer("stall")
        async with raw as url:
            opts = options(t, transport=transport, max_retries=1, read_timeout=0.2, connect_timeout=1.0)
            client = ServiceClient(url, USER, PASSWORD, options=opts)
            with pytest.raises(errors.ServiceError) as info:
                await call(client)
            await client.aclose()
        return info.value, raw.requests

    read_error, read_requests = run(scenario(call_get))
    assert isinstance(read_error, errors.ReadTimeoutError), repr(read_error)
    assert read_requests == 2
    write_error, write_requests = run(scenario(call_post))
    assert isinstance(write_error, errors.ReadTimeoutError), repr(write_error)
    assert write_requests == 1


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self.format(record))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_canary_password_never_appears_in_logs_or_errors(transport: str) -> None:
    canary_user, canary = "canary-user", "Canary pw/ä+&=7x"
    pair = f"{canary_user}:{canary}"
    forms = {
        canary,
        quote(canary, safe=""),
        quote_plus(canary),
        base64.b64encode(pair.encode()).decode(),
        quote(pair, safe=""),
    }
    # A server that misbehaves in every way we know, and echoes what it got into its errors.
    script = iter(
        [
            (500, b'{"error": {"code": "boom", "message": "boom"}}'),
            (200, b"not json"),
            (429, b""),
            (200, b'{"stores": []}'),
        ]
    )

    async def app(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                auth = next(
                    (
                        line.split(b":", 1)[1].strip().decode()
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"authorization:")
                    ),
                    "",
                )
                path = head.split(b" ")[1]
                if path.startswith(b"/svcapi/users/login"):
                    length = int(
                        next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(
                            b":"
                        )[1]
                    )
                    body = await reader.readexactly(length)
                    message = f"bad login {body.decode()} with {auth}".replace('"', "'")
                    payload = orjson.dumps({"error": {"code": "bad_request", "message": message}})
                    status = 400
                elif path.startswith(b"/svcapi/clients/clientdetails"):
                    writer.close()  # dropped
                    return
                else:
                    status, payload = next(script, (401, orjson.dumps({"error": {"message": auth}})))
                extra = b"Retry-After: 0\r\n" if status == 429 else b""
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
                    % (status, extra, len(payload), payload)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    collect = Collect()
    collect.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    names = ["httpx", "httpcore", "aiohttp", "asyncio", "membersync", *redact.LOGGER_NAMES]
    old_levels = {n: logging.getLogger(n).level for n in names}
    root.addHandler(collect)
    root.setLevel(logging.DEBUG)
    for n in names:
        logging.getLogger(n).setLevel(logging.DEBUG)
    raised: list[BaseException] = []

    async def go() -> None:
        server = await asyncio.start_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        t = FakeTime()
        opts = options(t, transport=transport, max_retries=3)
        async with ServiceClient(url, canary_user, canary, options=opts) as client:
            for call in (
                client.storelist(),  # 500, bad JSON, 429 -> then fine
                client.storelist(),  # 401 echoing the Authorization header
                client.login(username="someone", password=canary),  # 400 echoing body and header
                client.clientdetails("000001"),  # dropped connection
            ):
                try:
                    await call
                except errors.ServiceError as exc:
                    raised.append(exc)
                    logging.getLogger("membersync.test").exception("call failed: %s", exc)
        refused = ServiceClient(f"http://127.0.0.1:{free_port()}", canary_user, canary, options=opts)
        try:
            await refused.storelist()
        except errors.ServiceError as exc:
            raised.append(exc)
        await refused.aclose()
        server.close()

    try:
        run(go())
    finally:
        root.removeHandler(collect)
        root.setLevel(old_level)
        for n, level in old_levels.items():
            logging.getLogger(n).setLevel(level)

    assert [type(e) for e in raised] == [
        errors.AuthenticationError,
        errors.BadRequestError,
        errors.ConnectionDropped,
        errors.ConnectError,
    ]
    assert any("storelist" in text and "-> 500" in text for text in collect.texts)  # DEBUG was on
    texts = collect.texts + [
        "".join(traceback.format_exception(e)) + repr(e) + str(e.__dict__) for e in raised
    ]
    for text in texts:
        for form in forms:
            assert form not in text, (form, text)
