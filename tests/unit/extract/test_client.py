"""The client (``extract/client.py``) against ``httpx.MockTransport`` (paths a server cannot
produce on demand) on a fake clock: a 429 pauses every request, writes are repeated only when
they certainly did not reach the server, malformed bodies, credentials only in the header,
verbatim queries, a typed method per endpoint, a tenant profile, search paging, settings.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from client_doubles import (
    PASSWORD,
    PAYMENT,
    STORES,
    USER,
    call_get,
    call_post,
    err,
    mock_client,
    ok,
    options,
    run,
    scripted,
)
from fake_time import FakeTime
from membersync.extract import catalogue, constants, errors
from membersync.extract.client import ServiceClient
from membersync.extract.profile import Profile


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
    # It waited for the rest of the shared pause (a long Retry-After: a window's end), then for
    # its slot one interval after the retry's: a window that accepted nothing of ours teaches no
    # rate, so the pace was not cut (it is the slow start's, 1 / INITIAL_RATE apart).
    assert t.sleeps == [2.0, pytest.approx(1.0 / constants.INITIAL_RATE)]


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
