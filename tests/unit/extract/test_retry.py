"""The retry policy (``extract/retry.py``): which statuses and failures are retried, for reads
and writes; capped exponential backoff with full jitter; ``Retry-After`` in both forms, capped;
the documented defaults. Pure functions directly, the client through ``httpx.MockTransport``
on a fake clock: nothing waits for a backoff.
"""

from __future__ import annotations

from email.utils import formatdate

import pytest
from client_doubles import STORES, call_get, err, mock_client, run, scripted
from fake_time import WALL, FakeTime
from membersync.extract import constants, errors
from membersync.extract.client import ClientOptions
from membersync.extract.retry import parse_retry_after, retry_delay, should_retry


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
