"""A whole night at the limit, as the server saw it: the figure behind "98-100 % of a 200/s limit".

The rate matrix (:func:`membersync.flows.benchmarks.sync.run_rate_matrix`) runs 15-s nights and
measures from their 6th second; this runs the night a tenant runs (``--clients``, Prefect on, one
child process per night) against a sandbox in its own process limited to ``--rate`` req/s with
``burst`` tokens and ``--latency`` ms, and measures the **whole** night at the server:

- **% of limit**: the requests the server let through, over every second in which it was asked
  anything (a start-up gap with nothing asked is not the night's), divided by the rate;
- **% 429**: the share of every request the server saw that it answered 429, the rate's
  discovery included.

The line: >= 93 % of the limit with < 1 % answered 429 (goal >= 97 %); a bucket of one token is
reported, not gated (no client can keep a one-token bucket full at these rates: each request
must arrive in its own interval, and any jitter loses that interval)::

    python -m membersync.flows.benchmarks.whole_night --rate 200 --latency 20 \\
        --bursts 1,5,20,200 --clients 1500 [--markdown FILE] [--next-night]

``--next-night`` measures a tenant's every night but the first: the second night of a data dir,
started at the rate the first found (the first, unmeasured, runs against the same sandbox).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from membersync.flows.benchmarks.sync import (
    counts_since,
    err,
    markdown_table,
    out,
    run_child,
    sandbox_process,
)
from membersync.warehouse.exports.table_print import print_table

LINE_SHARE, LINE_429, GOAL_SHARE = 0.93, 0.01, 0.97
UNGATED_BURST = 1.0  # reported, not gated (see the module's docstring)
COLUMNS = (
    ("rate/s", "---:"),
    ("burst", "---:"),
    ("latency", "---:"),
    ("clients", "---:"),
    ("requests", "---:"),
    ("seconds asked", "---:"),
    ("% of limit", "---:"),
    ("% 429", "---:"),
    ("retries", "---:"),
    ("line", "---"),
)


@dataclass(frozen=True)
class WholeNight:
    rate: float
    burst: float
    latency_ms: float
    clients: int
    requests: int  # as the client counted them
    retries: int
    share_of_limit: float
    share_429: float
    seconds: int  # seconds in which the server was asked anything

    @property
    def verdict(self) -> str:
        if self.burst <= UNGATED_BURST:
            return "reported"
        met = self.share_of_limit >= LINE_SHARE and self.share_429 < LINE_429
        return ("met" + (", goal too" if self.share_of_limit >= GOAL_SHARE else "")) if met else "MISSED"

    def row(self) -> list[str]:
        return [
            f"{self.rate:g}",
            f"{self.burst:g}",
            f"{self.latency_ms:g} ms",
            f"{self.clients:,}",
            f"{self.requests:,}",
            f"{self.seconds:,}",
            f"{self.share_of_limit:.1%}",
            f"{self.share_429:.2%}",
            f"{self.retries:,}",
            self.verdict,
        ]


def asked_share(stats: dict[str, Any], before: dict[str, Any], rate: float) -> tuple[float, float, int]:
    """(share of the limit, share answered 429, seconds asked) over the whole night."""
    passed = counts_since(stats, before, "passed_per_second")
    refused = counts_since(stats, before, "refused_per_second")
    asked = set(passed) | set(refused)
    if not asked:
        raise RuntimeError("the server was asked nothing: the night did not run")
    through, turned_away = sum(passed.values()), sum(refused.values())
    return through / len(asked) / rate, turned_away / (through + turned_away), len(asked)


def whole_night(rate: float, burst: float, latency_ms: float, clients: int, next_night: bool) -> WholeNight:
    """One full night of ``clients`` through the Prefect flow, measured at the server; with
    ``next_night``, the night after it (in its data dir: it starts at the rate the first found)."""
    with (
        sandbox_process(clients, rate=rate, latency_ms=latency_ms, burst=burst) as url,
        tempfile.TemporaryDirectory(prefix="membersync-whole-night-") as tmp,
    ):
        data_dir = Path(tmp) / "data"
        if next_night:
            run_child(url, prefect=True, timeout=3600, data_dir=data_dir)
        httpx.get(f"{url}/_sandbox/stats", timeout=5)  # (warm: the sandbox counts from here)
        before = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
        night = run_child(url, prefect=True, timeout=3600, data_dir=data_dir)
        after = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
    share, share_429, seconds = asked_share(after, before, rate)
    return WholeNight(
        rate, burst, latency_ms, clients, night.requests, night.retries, share, share_429, seconds
    )


def run(
    rate: float,
    latency_ms: float,
    bursts: Sequence[float],
    clients: int,
    markdown: str | None,
    next_night: bool = False,
) -> int:
    nights = []
    for burst in bursts:
        err.print(f"rate {rate:g}/s burst {burst:g} latency {latency_ms:g} ms, {clients:,} clients ...")
        night = whole_night(rate, burst, latency_ms, clients, next_night)
        err.print(f"  {night.share_of_limit:.1%} of the limit, {night.share_429:.2%} 429")
        nights.append(night)
    header = [name for name, _ in COLUMNS]
    rows = [tuple(n.row()) for n in nights]
    print_table(
        header,
        rows,
        title="the next night at the limit (Prefect on)"
        if next_night
        else "a whole night at the limit (Prefect on)",
        right_aligned=tuple(header[:-1]),
        out=out,
    )
    if markdown:
        Path(markdown).write_text(markdown_table(COLUMNS, (n.row() for n in nights)) + "\n", encoding="utf-8")
    return 0 if all(n.verdict != "MISSED" for n in nights) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.whole_night")
    parser.add_argument("--rate", type=float, default=200.0, help="the server's limit, req/s")
    parser.add_argument("--latency", type=float, default=20.0, help="ms added to every answer")
    parser.add_argument("--bursts", default="1,5,20,200", help="bucket sizes, comma-separated")
    parser.add_argument("--clients", type=int, default=1500)
    parser.add_argument("--markdown", help="also write the table as Markdown to this file")
    parser.add_argument(
        "--next-night",
        action="store_true",
        help="measure the second night of a data dir (it starts at the rate the first found)",
    )
    args = parser.parse_args(argv)
    try:
        bursts = [float(b) for b in args.bursts.split(",")]
    except ValueError:
        parser.error(f"--bursts must be numbers separated by commas, not {args.bursts!r}")
    return run(args.rate, args.latency, bursts, args.clients, args.markdown, args.next_night)


if __name__ == "__main__":
    sys.exit(main())
