"""The ideal pacer (``benchmarks.ideal``): what it counts is what the server saw.

It is the evidence that some cells of the rate matrix are out of any client's reach on this
server, so its counts must be the server's own: every request it sends reaches the sandbox's
bucket once, and every status it reads is the one the sandbox counted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from membersync.extract.sandbox.server import RunningSandbox
from membersync.flows.benchmarks import ideal
from membersync.flows.benchmarks.sync import NightsOfACell

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


def _night(pace: float, share: float, steady_429: float, late_p99_ms: float = 0.3) -> ideal.IdealCell:
    return ideal.IdealCell(50.0, 1.0, 20.0, pace, 712, share, steady_429, 0.05, late_p99_ms, 3.0)


def test_case_the_ideal_pacer_is_judged_by_the_rate_matrix_line_not_by_its_pace() -> None:
    """Sent at 95 %, the server let 94.9 % through with no 429 (2026-11-28, 50/1/20 ms): not met,
    as our night would not be; sent at 96 %, 95.3 % through and 0.69 % refused is met; 1.14 %
    refused is not, whatever the share."""
    assert not _night(0.95, 0.949, 0.0).ok
    assert _night(0.96, 0.953, 0.0069).ok
    assert not _night(0.97, 0.960, 0.0114).ok


def test_case_the_ideal_pacer_of_several_nights_counts_the_nights_met(tmp_path: Path) -> None:
    """``--nights 3``: each cell and pace three nights, read as the median, the lowest, the worst
    late p99 and how many nights met it (truth by hand: the middle of three sorted values)."""
    cell = NightsOfACell(
        (_night(0.96, 0.953, 0.0069), _night(0.96, 0.960, 0.0, 0.52), _night(0.96, 0.949, 0.0))
    )
    assert cell.median_share == 0.953 and cell.lowest_share == 0.949 and cell.met == 2
    markdown = tmp_path / "ideal.md"
    ideal._print_nights([cell], str(markdown))
    text = markdown.read_text(encoding="utf-8")
    assert (
        "| 50 | 1 | 20 ms | 96% | 95.3% | 94.9% | 0.00% | 0.520 ms | 2 of 3 "
        "| 95.3% (0.69%), 96.0% (0.00%), 94.9% (0.00%) |"
    ) in text
    assert "0 of 1 cells met in every night, 1 in most" in text
