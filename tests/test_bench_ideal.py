"""The ideal pacer (``benchmarks.ideal``): what it counts is what the server saw.

It is the evidence that some cells of the rate matrix are out of any client's reach on this
server, so its counts must be the server's own: every request it sends reaches the sandbox's
bucket once, and every status it reads is the one the sandbox counted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from membersync.extract.sandbox.server import RunningSandbox
from membersync.flows.benchmarks import ideal

AUTH = ("pacer", "pacer-password")


def _passed(running: RunningSandbox) -> int:
    return sum(running.stats.passed_per_second.values())


def test_case_a_pace_far_under_a_one_token_bucket_is_all_passed(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    running = fresh_sandbox(clients=30, rate=20.0, burst=1.0, username=AUTH[0], password=AUTH[1])
    requests = ideal.build_requests(running.url, 8, AUTH)
    searched = _passed(running)
    # A quarter of the bucket's rate: 150 ms of slack a request, far beyond any stall here.
    paced = ideal.pace_at(running.url, requests, 5.0, pool=8)
    assert paced.statuses == {200: 8}
    assert _passed(running) - searched == 8
    assert running.stats.rate_limited == 0
    assert len(paced.late) == 8


def test_case_twice_the_rate_with_answers_in_flight_counts_what_the_server_counted(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    """100 ms of latency at 40 req/s: about four answers in flight at once on two pooled sockets,
    so the pacer reads several sockets at a time and opens more connections as it goes."""
    running = fresh_sandbox(
        clients=30, rate=20.0, burst=1.0, latency_ms=100.0, username=AUTH[0], password=AUTH[1]
    )
    requests = ideal.build_requests(running.url, 40, AUTH)
    searched = _passed(running)
    paced = ideal.pace_at(running.url, requests, 40.0, pool=2)
    assert set(paced.statuses) <= {200, 429}
    assert paced.statuses[429] == running.stats.rate_limited
    assert paced.statuses[200] == _passed(running) - searched
    assert sum(paced.statuses.values()) == len(requests)
    # A one-token bucket takes at most one request per 50 ms (+ the first): at 25 ms apart, at
    # most 21 of the 40 pass, whatever the jitter.
    assert paced.statuses[200] <= 21, paced.statuses


def test_case_an_answer_without_content_length_or_with_bytes_after_it_is_an_error() -> None:
    assert ideal._whole_answer(bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{")) is None
    assert ideal._whole_answer(bytearray(b"HTTP/1.1 429 Too Many\r\nContent-Length: 2\r\n\r\n{}")) == 429
    with pytest.raises(RuntimeError, match="without Content-Length"):
        ideal._whole_answer(bytearray(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}"))
    with pytest.raises(RuntimeError, match="bytes after an answer"):
        ideal._whole_answer(bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1"))
