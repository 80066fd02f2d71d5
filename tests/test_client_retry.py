"""The client's retry policy, error tree, limits and redaction.

Pure functions are tested directly; retry/error paths that a server cannot produce on
demand go through ``httpx.MockTransport``; refused, dropped and stalled connections are
real sockets (small asyncio servers), with both transports. Time is a fake clock whose
``sleep`` only advances it: nothing here waits for a backoff.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import traceback
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import orjson
import pytest
from fake_time import WALL, FakeTime
from membersync.extract import catalogue, constants, errors, redact
from membersync.extract.client import ClientOptions, ServiceClient
from membersync.extract.profile import Profile
from membersync.extract.retry import parse_retry_after, retry_delay, should_retry
from membersync.flows.schedule import free_port

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


# -- pure policy ------------------------------------------------------------------------------


def _status(status: int) -> errors.ServiceError:
    return errors.status_error("ep", status, b"")


@pytest.mark.parametrize("status", sorted(constants.RETRY_STATUSES))
def test_transient_statuses_are_retried_for_reads(status: int) -> None:
    assert should_retry("GET", _status(status), 0, 3)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 405, 422, 501, 505])
def test_final_statuses_are_never_retried(status: int) -> None:
    assert not should_retry("GET", _status(status), 0, 3)
    assert not should_retry("POST", _status(status), 0, 3)


@pytest.mark.parametrize(
    ("error", "post_retried"),
    [
        (errors.RateLimitedError("ep", 429), True),
        (errors.ConnectError("ep"), True),
        (errors.ConnectTimeoutError("ep"), True),
        (errors.PoolTimeoutError("ep"), True),
        (errors.ServerError("ep", 500), False),
        (errors.ServerError("ep", 503), False),
        (errors.ReadTimeoutError("ep"), False),
        (errors.WriteTimeoutError("ep"), False),
        (errors.ConnectionDropped("ep"), False),
        (errors.ProtocolError("ep", 200), False),
    ],
)
def test_writes_are_retried_only_when_they_certainly_did_not_reach_the_server(
    error: errors.ServiceError, post_retried: bool
) -> None:
    assert should_retry("GET", error, 0, 3)  # every one of them is transient for a read
    assert should_retry("POST", error, 0, 3) is post_retried


def test_retries_are_bounded() -> None:
    error = errors.ServerError("ep", 503)
    assert should_retry("GET", error, 2, 3)
    assert not should_retry("GET", error, 3, 3)
    assert not should_retry("GET", error, 0, 0)


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    top = [retry_delay(n, base=0.5, cap=10.0, rand=lambda: 1.0) for n in range(7)]
    assert top == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert retry_delay(3, base=0.5, cap=10.0, rand=lambda: 0.0) == 0.0
    assert retry_delay(3, base=0.5, cap=10.0, rand=lambda: 0.25) == 1.0
    assert retry_delay(10_000, base=0.5, cap=10.0, rand=lambda: 1.0) == 10.0  # no overflow


def test_retry_after_wins_over_backoff_and_is_capped() -> None:
    assert retry_delay(0, 7.0, rand=lambda: 1.0) == 7.0
    assert retry_delay(5, 0.0, rand=lambda: 1.0) == 0.0
    assert retry_delay(0, 10_000.0, retry_after_cap=60.0) == 60.0


def test_parse_retry_after_delta_seconds() -> None:
    assert parse_retry_after("5", WALL) == 5.0
    assert parse_retry_after(" 0 ", WALL) == 0.0
    assert parse_retry_after("-3", WALL) == 0.0
    assert parse_retry_after("999999", WALL, cap=120.0) == 120.0


def test_parse_retry_after_http_date() -> None:
    assert parse_retry_after(formatdate(WALL + 42, usegmt=True), WALL) == pytest.approx(42.0)
    assert parse_retry_after(formatdate(WALL - 42, usegmt=True), WALL) == 0.0
    assert parse_retry_after(formatdate(WALL + 86400, usegmt=True), WALL, cap=90.0) == 90.0


@pytest.mark.parametrize("value", [None, "", "soon", "Thu, 99 Foo 2024", "nan"])
def test_parse_retry_after_unreadable(value: str | None) -> None:
    assert parse_retry_after(value, WALL) is None


# -- retries through the client (MockTransport) -----------------------------------------------


def test_retry_after_seconds_is_honoured() -> None:
    t = FakeTime()
    handler, seen = scripted(err(429, "rate_limited", **{"Retry-After": "7"}), STORES)
    client = mock_client(handler, t)
    assert run(call_get(client))[0]["name"] == "Downtown"
    assert len(seen) == 2
    assert t.sleeps == [7.0]  # the retry's own wait covers the shared cool-down
    assert client.stats.retries == 1 and client.stats.status_429 == 1


def test_retry_after_http_date_is_honoured() -> None:
    t = FakeTime()
    when = formatdate(t.wall() + 42, usegmt=True)
    handler, seen = scripted(err(503, **{"Retry-After": when}), STORES)
    client = mock_client(handler, t)
    run(call_get(client))
    assert len(seen) == 2
    assert t.sleeps == [pytest.approx(42.0)]


def test_retry_after_is_capped() -> None:
    t = FakeTime()
    handler, _ = scripted(err(429, **{"Retry-After": "3600"}), STORES)
    run(call_get(mock_client(handler, t, retry_after_max=30.0)))
    assert t.sleeps == [30.0]


def test_case_the_documented_defaults_six_attempts_and_a_120_s_cap() -> None:
    """docs/sync.md promises, with no option set: a transient failure is retried 5 times (6
    attempts in all), and a server's Retry-After is honoured up to 120 s. The other tests set
    their own bounds; this one pins the defaults a user reads (literals, not the constants)."""
    t = FakeTime()
    handler, seen = scripted(err(503))
    client = mock_client(handler, t, max_retries=ClientOptions().max_retries)
    with pytest.raises(errors.ServerError):
        run(call_get(client))
    assert len(seen) == 6
    t = FakeTime()
    handler, _ = scripted(err(429, **{"Retry-After": "86400"}), STORES)
    run(call_get(mock_client(handler, t, retry_after_max=ClientOptions().retry_after_max)))
    assert t.sleeps == [120.0]


def test_a_429_pauses_every_request_not_just_the_refused_one() -> None:
    t = FakeTime()
    handler, _ = scripted(err(429, **{"Retry-After": "5"}), STORES)

    async def go() -> None:
        async with mock_client(handler, t) as client:
            await client.storelist()  # 429, then retried after 5 s
            t.now = client.rate.paused_until - 2.0  # pretend another request starts inside the pause
            t.sleeps.clear()
            await client.storelist()

    run(go())
    # It waited for the rest of the shared pause (a long Retry-After), then for its slot: a 429
    # before any answer starts the pace at its floor (MIN_RATE, a slow start), one interval on.
    assert t.sleeps == [2.0, 1.0 / constants.MIN_RATE]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409])
def test_no_retry_on_client_errors(status: int) -> None:
    expected = {
        400: errors.BadRequestError,
        401: errors.AuthenticationError,
        403: errors.PermissionDeniedError,
        404: errors.NotFoundError,
        409: errors.ConflictError,
    }[status]
    for call in (call_get, call_post):
        t = FakeTime()
        handler, seen = scripted(err(status), STORES)
        client = mock_client(handler, t)
        with pytest.raises(expected) as info:
            run(call(client))
        assert len(seen) == 1 and t.sleeps == []
        assert info.value.status == status
        assert client.stats.retries == 0 and client.stats.errors == 1


@pytest.mark.parametrize(
    "failure",
    [
        err(500),
        err(502),
        err(503),
        err(504),
        httpx.ReadTimeout("timed out"),
        httpx.WriteTimeout("timed out"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("connection reset"),
    ],
    ids=["500", "502", "503", "504", "read-timeout", "write-timeout", "dropped", "reset"],
)
def test_a_write_is_not_repeated_when_it_may_have_reached_the_server(failure: Any) -> None:
    t = FakeTime()
    handler, seen = scripted(failure, PAYMENT)
    with pytest.raises(errors.ServiceError) as info:
        run(call_post(mock_client(handler, t)))
    assert len(seen) == 1
    assert info.value.endpoint == "insert_payment"
    # ... while a read is retried after the very same failure
    t = FakeTime()
    handler, seen = scripted(failure, STORES)
    run(call_get(mock_client(handler, t)))
    assert len(seen) == 2


@pytest.mark.parametrize(
    "failure",
    [httpx.ConnectError("refused"), httpx.ConnectTimeout("timed out"), err(429, **{"Retry-After": "1"})],
    ids=["connect-error", "connect-timeout", "429"],
)
def test_a_write_is_repeated_when_it_certainly_did_not_reach_the_server(failure: Any) -> None:
    t = FakeTime()
    handler, seen = scripted(failure, PAYMENT)
    assert run(call_post(mock_client(handler, t))) == {"paymentId": "P1"}
    assert len(seen) == 2
    assert seen[0].content == seen[1].content  # the same body, sent again


@pytest.mark.parametrize(
    "body",
    [b"<html>502 Bad Gateway</html>", b"", b"[1, 2]", b'"text"', b'{"unexpected": []}', b'{"stores": {}}'],
    ids=["html", "empty", "array", "string", "no-wrapper", "wrapper-not-list"],
)
def test_a_malformed_body_is_retried_for_a_read(body: bytes) -> None:
    t = FakeTime()
    handler, seen = scripted(httpx.Response(200, content=body), STORES)
    assert run(call_get(mock_client(handler, t)))[0]["storecode"] == "DOWNTOWN  "
    assert len(seen) == 2


def test_a_malformed_body_is_a_protocol_error_in_the_end() -> None:
    t = FakeTime()
    handler, seen = scripted(httpx.Response(200, content=b"<html>oops</html>"))
    with pytest.raises(errors.ProtocolError) as info:
        run(call_get(mock_client(handler, t)))
    assert len(seen) == 4 and info.value.attempts == 4
    assert "storelist" in str(info.value) and "not JSON" in str(info.value)


def test_a_write_answer_without_its_field_is_a_protocol_error_not_retried() -> None:
    t = FakeTime()
    handler, seen = scripted(ok({"something": "else"}), PAYMENT)
    with pytest.raises(errors.ProtocolError, match="paymentId"):
        run(call_post(mock_client(handler, t)))
    assert len(seen) == 1


def test_attempts_are_bounded_and_backoff_grows() -> None:
    t = FakeTime()
    handler, seen = scripted(err(503))
    client = mock_client(handler, t, max_retries=3, backoff_base=0.5)
    with pytest.raises(errors.ServerError) as info:
        run(call_get(client))
    assert len(seen) == 4
    assert t.sleeps == [0.25, 0.5, 1.0]  # rand() = 0.5 of 0.5, 1, 2
    assert info.value.attempts == 4 and "after 4 attempts" in str(info.value)
    stats = client.stats.as_dict()
    assert stats["requests"] == 4 and stats["retries"] == 3 and stats["errors"] == 1
    assert stats["by_status"] == {"503": 4}


def test_rate_limited_error_after_the_retries() -> None:
    t = FakeTime()
    handler, seen = scripted(err(429, "rate_limited", "slow down", **{"Retry-After": "2"}))
    client = mock_client(handler, t, max_retries=2)
    with pytest.raises(errors.RateLimitedError) as info:
        run(call_get(client))
    assert len(seen) == 3 and info.value.retry_after == 2.0
    assert client.stats.status_429 == 3


@pytest.mark.parametrize("name", sorted(catalogue.SECRET_FIELDS))
def test_case_every_declared_secret_field_is_masked_in_log_text(name: str) -> None:
    """Case: a log line quoting a record (JSON, or key=value) never shows a secret field's value,
    for every field the catalogue declares secret (the redaction reads the declaration)."""
    for text in (f'{{"{name}": "canary-7f3e"}}', f"{name}=canary-7f3e", f"'{name}': 'canary-7f3e'"):
        assert "canary-7f3e" not in redact.scrub(text), text


def test_error_text_names_endpoint_and_status_and_never_a_secret() -> None:
    t = FakeTime()
    token, account = "tok_live_9f8e7d6c", "000123456789"
    echo = f"tokenId {token} rejected for account {account}; auth was {PASSWORD}"
    handler, seen = scripted(err(400, "invalid_field", echo))
    with pytest.raises(errors.BadRequestError) as info:
        run(
            mock_client(handler, t).update_billing_info(
                clientNumber="000417",
                membershipId="M1",
                type="CARD",
                deductType="MONTHLY",
                tokenId=token,
                accountNo=account,
            )
        )
    error = info.value
    text = " ".join([str(error), repr(error), "".join(traceback.format_exception(error))])
    assert "update_billing_info" in str(error) and "HTTP 400" in str(error)
    assert "invalid_field" in str(error)
    assert error.field == "tokenId"
    for secret in (token, account, PASSWORD, seen[0].headers["authorization"].split()[1]):
        assert secret not in text
    assert error.__cause__ is None


def test_an_error_body_that_is_not_json_still_gives_a_typed_error() -> None:
    t = FakeTime()
    handler, _ = scripted(httpx.Response(404, content=b"<html><body>Not Found</body></html>"))
    with pytest.raises(errors.NotFoundError) as info:
        run(mock_client(handler, t).clientdetails("000999"))
    assert str(info.value) == "clientdetails: HTTP 404: NotFoundError"


def test_transport_errors_are_raised_without_their_cause() -> None:
    t = FakeTime()
    handler, _ = scripted(httpx.ConnectError("[Errno 111] Connection refused"))
    with pytest.raises(errors.ConnectError) as info:
        run(call_get(mock_client(handler, t, max_retries=0)))
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert info.value.status is None
    assert (
        str(info.value)
        == "storelist: no HTTP answer: could not connect (ConnectError: [Errno 111] Connection refused)"
    )


def test_errors_survive_pickling() -> None:
    import pickle

    error = errors.status_error("clientdetails", 409, b'{"error": {"code": "invalid_state", "message": "x"}}')
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.ConflictError and str(copy) == str(error) and copy.code == "invalid_state"


# -- requests on the wire ------------------------------------------------------------------------


def test_credentials_go_only_in_the_authorization_header() -> None:
    t = FakeTime()
    handler, seen = scripted(ok({"client": {"clientNumber": "000417"}}))
    run(mock_client(handler, t).clientdetails("000417"))
    request = seen[0]
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert request.headers["authorization"] == expected
    assert PASSWORD not in str(request.url) and quote(PASSWORD, safe="") not in str(request.url)
    assert request.url.params["clientNumber"] == "000417"


def test_base_url_with_credentials_is_refused() -> None:
    with pytest.raises(ValueError, match="must not carry credentials"):
        ServiceClient("http://u:p@svc.test", USER, PASSWORD)


def test_query_values_are_sent_verbatim() -> None:
    t = FakeTime()
    handler, seen = scripted(ok({"products": []}))
    run(mock_client(handler, t).processor_credentials("DOWN TOWN ", "POS"))
    assert seen[0].url.params["storecode"] == "DOWN TOWN "  # spaces kept, trailing one included
    assert seen[0].url.params["type"] == "POS"


def test_every_catalogue_endpoint_has_a_typed_method() -> None:
    for ep in catalogue.ENDPOINTS:
        assert callable(getattr(ServiceClient, ep.name, None)), ep.name


def test_a_tenant_profile_renames_params_wrappers_and_fields(tmp_path: Any) -> None:
    path = tmp_path / "tenant.toml"
    path.write_text(
        "[params]\nclientNumber = 'clientNo'\n"
        "[wrappers]\ntransactionhistory = 'sales'\n"
        "[fields.transaction]\nreceiptNumber = 'receiptNo'\nlines = 'items'\n"
        "[fields.transactionLine]\npricePerUnit = 'unitPrice'\n"
        "[fields.transactionPayment]\namount = 'amt'\n"
    )
    profile = Profile.load(path)
    wire = {"sales": [{"receiptNo": "R1", "items": [{"unitPrice": "1.50"}], "payments": [{"amt": 3}]}]}
    t = FakeTime()
    handler, seen = scripted(ok(wire))
    client = ServiceClient(
        "http://svc.test",
        USER,
        PASSWORD,
        profile=profile,
        transport=httpx.MockTransport(handler),
        options=options(t),
    )
    got = run(client.transactionhistory("000417"))
    assert seen[0].url.params["clientNo"] == "000417"
    assert got == [{"receiptNumber": "R1", "lines": [{"pricePerUnit": "1.50"}], "payments": [{"amount": 3}]}]


def test_search_pages_until_total_count() -> None:
    t = FakeTime()
    pages = {
        1: {
            "clients": [{"clientNumber": "1"}, {"clientNumber": "2"}],
            "page": 1,
            "pageSize": 2,
            "totalCount": 5,
        },
        2: {
            "clients": [{"clientNumber": "3"}, {"clientNumber": "4"}],
            "page": 2,
            "pageSize": 2,
            "totalCount": 5,
        },
        3: {"clients": [{"clientNumber": "5"}], "page": 3, "pageSize": 2, "totalCount": 5},
    }
    asked: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(int(request.url.params["page"]))
        assert request.url.params["lastName"] == "Smith"
        return ok(pages[asked[-1]])

    async def go() -> list[str]:
        async with mock_client(handler, t, page_size=2) as client:
            return [c["clientNumber"] async for page in client.search(lastName="Smith") for c in page.items]

    assert run(go()) == ["1", "2", "3", "4", "5"]
    assert asked == [1, 2, 3]


# -- limits (fake clock: nothing waits) ----------------------------------------------------------


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


# -- the canary: no secret in any log record or error text --------------------------------------


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


def test_from_settings_uses_the_settings_and_the_tenant_profile(tmp_path: Any) -> None:
    from membersync.extract.settings import ServiceSettings, Settings

    path = tmp_path / "tenant.toml"
    path.write_text("[params]\nclientNumber = 'clientNo'\n")
    env = {
        "MEMBERSYNC_BASE_URL": "http://svc.test/",
        "MEMBERSYNC_USERNAME": USER,
        "MEMBERSYNC_PASSWORD": PASSWORD,
        "MEMBERSYNC_PROFILE": str(path),
    }
    client = ServiceClient.from_settings(ServiceSettings.from_settings(Settings.load(env)))
    assert client.base_url == "http://svc.test"
    assert client.profile.param("clientNumber") == "clientNo"
    assert PASSWORD not in repr(client) and PASSWORD not in repr(vars(client))
    run(client.aclose())


def test_fast_query_join_equals_parsing_the_whole_url() -> None:
    from membersync.extract import client as client_module

    base = httpx.URL("http://127.0.0.1:8700/svcapi/clients/clientmemberships")
    queries = (
        "clientNumber=000417",
        "storecode=DOWNTOWN%20%20&page=2",
        "modifiedSince=2026-01-02T03%3A04%3A05Z",
    )
    for query in queries:
        fast = client_module._with_query(base, query)
        assert fast == httpx.URL(f"{base}?{query}")
        assert fast.raw_path == httpx.URL(f"{base}?{query}").raw_path
    assert client_module._with_query is client_module._with_query_parsed  # httpx as pinned
