"""Whole nights at a server's limit, as the server saw them: the politeness figures of a night.

The rate matrix's timed nights (:func:`membersync.flows.benchmarks.sync.run_rate_matrix`) run 15 s
and measure from their 6th second; this runs the night a tenant runs (``--clients``, Prefect on,
one child process per night) against a sandbox in its own process, with ``--latency`` ms added to
every answer, and one of three limit kinds per row:

- a **token bucket** of ``--rate`` req/s and ``burst`` tokens (``--bursts``);
- a **fixed window** of ``--rate`` x ``--window`` requests per window, counted from its first
  request, ``Retry-After`` = the window's end (``--window SECONDS``, at each ``--rates``);
- a **cap on requests in flight** (``--caps N,N``; no rate limit): its sustained limit is
  ``N / latency`` req/s, what N at a time can ask when each answer takes the latency.

Measured at the server over the **whole** night, from the second of its first request to the
second of its last (a window's wait is the server's due, so it counts):

- **% of limit**: the requests the server let through per second over that span, over the
  sustained limit (the rate, or ``N / latency``);
- **% 429**: the share of every request the server saw that it answered 429, the discovery
  included.

``--ideal`` runs each row a second time with a client **told the limit** (``MEMBERSYNC_RATE`` at the
rate, ``MEMBERSYNC_MAX_CONCURRENCY`` at the cap): what any client could reach there, beside ours.

The line for a bucket: >= 93 % of the limit with < 1 % answered 429 (goal >= 97 %); a bucket of
one token is reported, not gated (no client can keep a one-token bucket full at these rates: each
request must arrive in its own interval, and any jitter loses that interval). For a window and a
cap: >= 90 % with < 1 % answered 429::

    python -m membersync.flows.benchmarks.whole_night --rate 200 --latency 20 \\
        --bursts 1,5,20,200 --clients 1500 [--markdown FILE] [--next-night]
    python -m membersync.flows.benchmarks.whole_night --rates 20,200 --window 60 --latency 20 --ideal
    python -m membersync.flows.benchmarks.whole_night --caps 4,16 --latency 20 --ideal

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

LINE_SHARE, LINE_429, GOAL_SHARE = 0.93, 0.01, 0.97  # a token bucket's
NEW_KINDS_SHARE = 0.90  # a fixed window's and a cap's goal (with < 1 % answered 429)
UNGATED_BURST = 1.0  # reported, not gated (see the module's docstring)
COLUMNS = (
    ("limit", "---"),
    ("latency", "---:"),
    ("sustained/s", "---:"),
    ("clients", "---:"),
    ("requests", "---:"),
    ("seconds", "---:"),
    ("% of limit", "---:"),
    ("% 429", "---:"),
    ("retries", "---:"),
    ("told the limit", "---:"),
    ("line", "---"),
)


@dataclass(frozen=True)
class ServerLimit:
    """One way a server limits a credential: a token bucket (``rate``, ``burst``), a fixed window
    (``rate`` x ``window`` requests a window of ``window`` s) or a cap of ``cap`` in flight."""

    rate: float = 0.0
    burst: float | None = None
    window: float = 0.0
    cap: int = 0

    @property
    def kind(self) -> str:
        return "cap" if self.cap else "window" if self.window else "bucket"

    @property
    def label(self) -> str:
        if self.cap:
            return f"{self.cap} in flight"
        if self.window:
            return f"{round(self.rate * self.window):,} per {self.window:g} s"
        return f"bucket {self.rate:g}/s, {self.burst or self.rate:g} tokens"

    def sustained(self, latency_ms: float) -> float:
        """Requests/s the limit allows for as long as a night lasts."""
        if self.cap:
            if latency_ms <= 0:
                raise ValueError("a cap's sustained limit is N / latency: give it a latency")
            return self.cap / (latency_ms / 1000)
        return self.rate

    def sandbox(self) -> dict[str, Any]:
        """The sandbox's options for this limit (:func:`sandbox_process`)."""
        if self.cap:
            return {"rate": 0.0, "max_in_flight": self.cap}
        if self.window:
            return {"rate": self.rate, "window": self.window}
        return {"rate": self.rate, "burst": self.burst}

    def told(self) -> dict[str, str]:
        """A client's settings when told this limit (the ideal beside ours)."""
        if self.cap:
            return {"MEMBERSYNC_MAX_CONCURRENCY": str(self.cap)}
        return {"MEMBERSYNC_RATE": f"{self.rate:g}"}


@dataclass(frozen=True)
class WholeNight:
    limit: ServerLimit
    latency_ms: float
    clients: int
    requests: int  # as the client counted them
    retries: int
    share_of_limit: float
    share_429: float
    seconds: int  # from the second of the first request to that of the last
    ideal: WholeNight | None = None  # the same night with a client told the limit

    @property
    def verdict(self) -> str:
        limit = self.limit
        if limit.kind == "bucket" and (limit.burst or limit.rate) <= UNGATED_BURST:
            return "reported"
        if limit.kind != "bucket":
            met = self.share_of_limit >= NEW_KINDS_SHARE and self.share_429 < LINE_429
            return "met" if met else "MISSED"
        met = self.share_of_limit >= LINE_SHARE and self.share_429 < LINE_429
        return ("met" + (", goal too" if self.share_of_limit >= GOAL_SHARE else "")) if met else "MISSED"

    def row(self) -> list[str]:
        ideal = self.ideal
        return [
            self.limit.label,
            f"{self.latency_ms:g} ms",
            f"{self.limit.sustained(self.latency_ms):g}",
            f"{self.clients:,}",
            f"{self.requests:,}",
            f"{self.seconds:,}",
            f"{self.share_of_limit:.1%}",
            f"{self.share_429:.2%}",
            f"{self.retries:,}",
            f"{ideal.share_of_limit:.1%}, {ideal.share_429:.2%} 429" if ideal else "",
            self.verdict,
        ]


def asked_share(stats: dict[str, Any], before: dict[str, Any], sustained: float) -> tuple[float, float, int]:
    """(share of the limit, share answered 429, seconds) over the whole night: from the second
    of its first request to the second of its last."""
    passed = counts_since(stats, before, "passed_per_second")
    refused = counts_since(stats, before, "refused_per_second")
    asked = set(passed) | set(refused)
    if not asked:
        raise RuntimeError("the server was asked nothing: the night did not run")
    through, turned_away = sum(passed.values()), sum(refused.values())
    seconds = max(asked) - min(asked) + 1
    return through / seconds / sustained, turned_away / (through + turned_away), seconds


def whole_night(
    limit: ServerLimit, latency_ms: float, clients: int, next_night: bool, told: bool = False
) -> WholeNight:
    """One full night of ``clients`` through the Prefect flow, measured at the server; with
    ``next_night``, the night after it (in its data dir: it starts at the rate the first found);
    with ``told``, a client told the limit."""
    env = limit.told() if told else None
    with (
        sandbox_process(clients, latency_ms=latency_ms, **limit.sandbox()) as url,
        tempfile.TemporaryDirectory(prefix="membersync-whole-night-") as tmp,
    ):
        data_dir = Path(tmp) / "data"
        if next_night:
            run_child(url, prefect=True, timeout=3600, data_dir=data_dir, extra_env=env)
        httpx.get(f"{url}/_sandbox/stats", timeout=5)  # (warm: the sandbox counts from here)
        before = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
        night = run_child(url, prefect=True, timeout=7200, data_dir=data_dir, extra_env=env)
        after = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
    share, share_429, seconds = asked_share(after, before, limit.sustained(latency_ms))
    return WholeNight(limit, latency_ms, clients, night.requests, night.retries, share, share_429, seconds)


def run(
    limits: Sequence[ServerLimit],
    latencies: Sequence[float],
    clients: int,
    markdown: str | None,
    next_night: bool = False,
    ideal: bool = False,
) -> int:
    """Each limit at each latency, a whole night (and, with ``ideal``, the night told the
    limit); the table, and its Markdown; exit 1 when a gated row missed its line."""
    nights = [_measured(lim, latency, clients, next_night, ideal) for lim in limits for latency in latencies]
    header = [name for name, _ in COLUMNS]
    title = f"{'the next' if next_night else 'a whole'} night at the limit (Prefect on)"
    rows = [tuple(n.row()) for n in nights]
    print_table(header, rows, title=title, right_aligned=tuple(header[1:-1]), out=out)
    if markdown:
        Path(markdown).write_text(markdown_table(COLUMNS, (n.row() for n in nights)) + "\n", encoding="utf-8")
    return 0 if all(n.verdict != "MISSED" for n in nights) else 1


def _measured(limit: ServerLimit, latency: float, clients: int, next_night: bool, ideal: bool) -> WholeNight:
    err.print(f"{limit.label}, latency {latency:g} ms, {clients:,} clients ...")
    night = whole_night(limit, latency, clients, next_night)
    err.print(f"  {night.share_of_limit:.1%} of the limit, {night.share_429:.2%} 429")
    if not ideal:
        return night
    told = whole_night(limit, latency, clients, next_night, told=True)
    err.print(f"  told the limit: {told.share_of_limit:.1%} of it, {told.share_429:.2%} 429")
    return WholeNight(**{**night.__dict__, "ideal": told})


def limits_from(
    rates: Sequence[float], bursts: Sequence[str], window: float, caps: Sequence[int]
) -> list[ServerLimit]:
    """The rows' limits: caps when given, else windows at each rate when a window is given, else
    a bucket of each burst (``R``: the rate) at each rate, each once."""
    if caps:
        return [ServerLimit(cap=cap) for cap in dict.fromkeys(caps)]
    if window:
        return [ServerLimit(rate=rate, window=window) for rate in dict.fromkeys(rates)]
    buckets = (ServerLimit(rate=r, burst=r if b.strip() == "R" else float(b)) for r in rates for b in bursts)
    return list(dict.fromkeys(buckets))


def _numbers(parser: argparse.ArgumentParser, text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"{name} must be numbers separated by commas, not {text!r}")
        raise  # (parser.error exits)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.whole_night")
    parser.add_argument("--rate", "--rates", dest="rates", default="200", help="limits in req/s (a,b,...)")
    parser.add_argument("--latency", default="20", help="ms added to every answer (comma-separated)")
    parser.add_argument("--bursts", default="1,5,20,200", help="bucket sizes, comma-separated")
    parser.add_argument("--window", type=float, default=0.0, help="a fixed window of this many s (no bucket)")
    parser.add_argument("--caps", default="", help="caps on requests in flight, no rate limit (a,b,...)")
    parser.add_argument("--clients", type=int, default=1500)
    parser.add_argument("--ideal", action="store_true", help="each row also with a client told the limit")
    parser.add_argument("--markdown", help="also write the table as Markdown to this file")
    parser.add_argument(
        "--next-night",
        action="store_true",
        help="measure the second night of a data dir (it starts at the rate the first found)",
    )
    args = parser.parse_args(argv)
    caps = [int(c) for c in _numbers(parser, args.caps, "--caps")]
    if any(c < 1 for c in caps) or args.window < 0:
        parser.error("--caps must be whole numbers >= 1 and --window >= 0 s")
    _numbers(parser, args.bursts.replace("R", "0"), "--bursts")
    limits = limits_from(_numbers(parser, args.rates, "--rates"), args.bursts.split(","), args.window, caps)
    latencies = _numbers(parser, args.latency, "--latency")
    return run(limits, latencies, args.clients, args.markdown, args.next_night, args.ideal)


if __name__ == "__main__":
    sys.exit(main())
