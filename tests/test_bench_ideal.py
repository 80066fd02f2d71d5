"""The ideal pacer (``benchmarks.ideal``): what it counts is what the server saw.

It is the evidence that some cells of the rate matrix are out of any client's reach on this
server, so its counts must be the server's own: every request it sends reaches the sandbox's
bucket once, and every status it reads is the one the sandbox counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from membersync.extract.sandbox.server import RunningSandbox
from membersync.flows.benchmarks import ideal

AUTH = ("pacer", "pacer-password")


def test_case_a_pace_under_a_one_token_bucket_is_all_passed_and_twice_its_rate_is_refused_in_part(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    running = fresh_sandbox(clients=30, rate=20.0, burst=1.0, username=AUTH[0], password=AUTH[1])
    stats = running.stats

    # Half the bucket's rate: 25 ms of slack a request, far beyond any jitter here.
    slow = ideal.pace_at(running.url, 10.0, 1.5, 0.0, auth=AUTH)
    assert slow.sent == 15
    assert slow.statuses == {200: 15}
    assert sum(stats.passed_per_second.values()) == 15 + 1  # (+ the pacer's search for client numbers)
    assert stats.rate_limited == 0

    time.sleep(0.1)  # the bucket's token is back for the pacer's search
    # Twice its rate: a one-token bucket takes at most one request per 50 ms, so about every other
    # request is refused; whatever the host's jitter, the counts on both sides agree.
    fast = ideal.pace_at(running.url, 40.0, 1.0, 0.0, auth=AUTH)
    assert fast.sent == 40
    assert sum(fast.statuses.values()) == 40
    assert set(fast.statuses) <= {200, 429}
    assert fast.statuses[429] == stats.rate_limited
    assert fast.statuses[200] + 1 == sum(stats.passed_per_second.values()) - 16
    assert 10 <= fast.statuses[429] <= 30, fast.statuses
    assert len(fast.late) == 40 and min(fast.late) >= 0.0
