"""What any client could hold at a token bucket: a pacer that knows the limit, against the sandbox.

The rate matrix (:func:`membersync.flows.benchmarks.sync.run_rate_matrix`) measures our night,
which must *find* the server's limit. This measures the other side of the question: sent at a
fixed share of a limit it is told, as evenly as a dedicated thread can send, how many requests
does the server refuse? Where even this pacer draws >= 1 % 429s at 95 % of the limit, no client
can meet the issue's cell on this server and host: the refusals come from how unevenly requests
reach the server's bucket (its own event loop, the loopback, the host's scheduling), not from a
client's pacing, which is measured here too (how late each request went to its socket).

The pacer has nothing of ours on its path, and one thread: it sends prebuilt HTTP/1.1 GETs of the
night's per-client reads on a pool of keep-alive sockets, each at ``t0 + k / pace``. Until
``READ_UNTIL_S`` before a request is due it reads the answers that came (a selector: status and
``Content-Length``; epoll's timeout is whole milliseconds), then sleeps (``clock_nanosleep``) to
``SPIN_S`` before it and spins the rest: no second thread to wait for, and a spin short enough
to leave the core to others. It never retries: a refused request is counted, not sent again.
The server's own counters, over the same span as the rate matrix (from the 6th second to the last
whole one), give the share of the limit and of 429s, and judge the cell by the rate matrix's
own line (:func:`~membersync.flows.benchmarks.sync.meets`): >= 95 % of the limit let through and
< 1 % of the requests the server saw in that span answered 429. One 15-s night is a coin toss
near that line: ``--nights N`` runs each cell and pace N nights in turn and counts those met::

    python -m membersync.flows.benchmarks.ideal --rates 20,50,200,500 --bursts 1 --pace 0.96 --nights 3
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import selectors
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from membersync.extract import catalogue
from membersync.flows.benchmarks.sync import (
    MET,
    PASSWORD,
    USERNAME,
    NightsOfACell,
    markdown_table,
    meets,
    print_nights,
    sandbox_process,
    server_share,
    verdict,
)
from rich.console import Console
from rich.table import Table

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

READ_UNTIL_S = 0.0015  # answers are read until this long before a send (epoll wakes <= 1 ms late)
SPIN_S = 0.0002  # and the last moment before it is spun, not slept (a sleep wakes ~0.05-0.1 ms late)
SKIP_S = 5  # seconds after the first request not measured (as in the rate matrix)
# The night's per-client reads whose only parameter is the client (a transaction history without
# dates is the whole one; the points history, which needs dates, is left out): each request of
# the pacer is one of them, in turn.
READS = tuple(
    ep.path for ep in catalogue.CLIENT_READ_ENDPOINTS if [p.name for p in ep.params] == ["clientNumber"]
)


@dataclass(frozen=True)
class IdealCell:
    rate: float
    burst: float
    latency_ms: float
    pace: float  # the share of the limit sent at
    sent: int
    share_of_limit: float  # passed/s at the server over the measured span, over the rate
    steady_429: float  # 429s among the requests the server saw in that span
    late_p50_ms: float  # how late a request went to its socket after its due time
    late_p99_ms: float
    late_max_ms: float

    @property
    def ok(self) -> bool:
        # The rate matrix's line, so that the two tables say the same of a cell. (Until 2026-11-28
        # the pace sent at, >= 95 %, stood for the share let through: the server let through
        # 94.4-94.9 % of 50/1/20 ms and 200/1/0 ms sent at 95 %, with 0-0.58 % refused, so a
        # client told the limit had to send at 96 % to meet them, and then refusals decide.)
        return meets(self.share_of_limit, self.steady_429)


class _Connections:
    """The pacer's keep-alive sockets: those free, and those waiting for an answer (a selector)."""

    def __init__(self, address: tuple[str, int], size: int) -> None:
        self.address = address
        self.selector = selectors.DefaultSelector()
        self.opened = [_connect(address) for _ in range(size)]  # before the first send
        self.free: collections.deque[socket.socket] = collections.deque(self.opened)
        self.waiting: dict[socket.socket, bytearray] = {}
        self.statuses: collections.Counter[int] = collections.Counter()

    def take(self) -> socket.socket:
        """A free socket; a new one when every socket waits for an answer (opened now, before the
        request is due)."""
        if self.free:
            return self.free.popleft()
        sock = _connect(self.address)
        self.opened.append(sock)
        return sock

    def sent_on(self, sock: socket.socket) -> None:
        self.waiting[sock] = bytearray()
        self.selector.register(sock, selectors.EVENT_READ)

    def read_until(self, until: float) -> None:
        """Read the answers that come until ``until`` (``time.perf_counter``)."""
        while (timeout := until - time.perf_counter()) > 0:
            for key, _ in self.selector.select(timeout) if self.waiting else ():
                self._read(key.fileobj)  # type: ignore[arg-type]
            if not self.waiting:
                return

    def _read(self, sock: socket.socket) -> None:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise RuntimeError("the sandbox closed a connection")
        buffer = self.waiting[sock]
        buffer += chunk
        status = _whole_answer(buffer)
        if status is not None:
            self.selector.unregister(sock)
            del self.waiting[sock]
            self.statuses[status] += 1
            self.free.append(sock)

    def close(self) -> None:
        self.selector.close()
        for sock in self.opened:
            sock.close()


def _whole_answer(buffer: bytearray) -> int | None:
    """The status of the HTTP/1.1 answer in ``buffer`` once it is whole (headers and
    ``Content-Length`` bytes of body), else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, _, value in (x.partition(":") for x in head[1:])}
    if "content-length" not in fields or "transfer-encoding" in fields:
        raise RuntimeError(f"an answer without Content-Length: {head[0]!r}")
    whole = end + 4 + int(fields["content-length"])
    if len(buffer) < whole:
        return None
    if len(buffer) > whole:  # one request at a time per connection: nothing may follow its answer
        raise RuntimeError(f"{len(buffer) - whole} bytes after an answer ({head[0]!r})")
    return int(head[0].split()[1])


def build_requests(url: str, count: int, auth: tuple[str, str] = (USERNAME, PASSWORD)) -> list[bytes]:
    """``count`` prebuilt GETs, the night's per-client reads in turn over the sandbox's clients."""
    for _ in range(5):  # (the bucket may be empty: a small one, just after the ready probe)
        search = httpx.get(
            f"{url}{catalogue.SEARCH.path}",
            params={"modifiedSince": "2000-01-01T00:00:00", "pageSize": 500},
            auth=auth,
            timeout=30,
        )
        if search.status_code != 429:
            break
        time.sleep(float(search.headers.get("Retry-After", "1")))
    search.raise_for_status()
    numbers = [item["clientNumber"] for item in search.json()["clients"]]
    host = urlsplit(url).netloc
    token = base64.b64encode(":".join(auth).encode()).decode()
    built = []
    for i in range(count):
        path, number = READS[i % len(READS)], numbers[(i // len(READS)) % len(numbers)]
        built.append(
            f"GET {path}?clientNumber={number} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Basic {token}\r\nAccept: application/json\r\n\r\n".encode()
        )
    return built


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@dataclass(frozen=True)
class Paced:
    late: list[float]  # how late each request went to its socket after its due time (s)
    statuses: dict[int, int]  # the answers' statuses, counted

    @property
    def sent(self) -> int:
        return len(self.late)


def pace_at(url: str, requests: list[bytes], pace: float, pool: int, spin: float = SPIN_S) -> Paced:
    """Send ``requests`` at ``pace`` req/s, each at ``t0 + k / pace``, on ``pool`` keep-alive
    connections opened beforehand (more if every one waits for an answer), and wait for every
    answer."""
    parts = urlsplit(url)
    connections = _Connections((parts.hostname or "127.0.0.1", parts.port or 80), pool)
    late: list[float] = []
    interval = 1.0 / pace
    clock = time.perf_counter
    try:
        t0 = clock() + 0.2
        for k, request in enumerate(requests):
            due = t0 + k * interval
            connections.read_until(due - READ_UNTIL_S)
            sock = connections.take()
            if (wait := due - clock() - spin) > 0:
                time.sleep(wait)
            while clock() < due:
                pass
            sock.sendall(request)
            late.append(clock() - due)
            connections.sent_on(sock)
        connections.read_until(clock() + 30)
        if connections.waiting:
            raise RuntimeError(f"{len(connections.waiting)} answers did not come within 30 s")
    finally:
        connections.close()
    return Paced(late, dict(connections.statuses))


def pool_for(pace: float, latency: float) -> int:
    """Keep-alive connections enough for ``pace`` req/s answered after ``latency`` s, three times
    over (a late answer must not make the pacer open a connection)."""
    return max(8, int(pace * (latency + 0.05) * 3))


def ideal_cell(
    rate: float, burst: float, latency_ms: float, pace: float, seconds: float, spin: float = SPIN_S
) -> IdealCell:
    clients = 500
    with sandbox_process(clients, rate=rate, latency_ms=latency_ms, burst=burst) as url:
        requests = build_requests(url, int(pace * rate * seconds))
        before = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
        time.sleep(1.5)  # the bucket is full again, whatever its size
        paced = pace_at(url, requests, pace * rate, pool_for(pace * rate, latency_ms / 1000), spin)
        after = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
    share, _night_429, steady_429, _span = server_share(after, rate, skip_s=SKIP_S, before=before)
    late_ms = sorted(x * 1000 for x in paced.late)
    return IdealCell(
        rate,
        burst,
        latency_ms,
        pace,
        paced.sent,
        share,
        steady_429,
        statistics.median(late_ms),
        late_ms[int(0.99 * (len(late_ms) - 1))],
        late_ms[-1],
    )


# The one-night table's columns (name, markdown alignment), in the order of ``_row``.
COLUMNS = (
    ("rate/s", "---:"),
    ("burst", "---:"),
    ("latency", "---:"),
    ("paced at", "---:"),
    ("sent", "---:"),
    ("% of limit", "---:"),
    ("% 429", "---:"),
    ("late p50", "---:"),
    ("late p99", "---:"),
    ("late max", "---:"),
    ("met", "---"),
)


def _row(c: IdealCell) -> list[str]:
    ms = (f"{x:.3f} ms" for x in (c.late_p50_ms, c.late_p99_ms, c.late_max_ms))
    return [
        f"{c.rate:g}",
        f"{c.burst:g}",
        f"{c.latency_ms:g} ms",
        f"{c.pace:.0%}",
        f"{c.sent:,}",
        f"{c.share_of_limit:.1%}",
        f"{c.steady_429:.2%}",
        *ms,
        "yes" if c.ok else "no",
    ]


def _markdown(cells: list[IdealCell]) -> str:
    met = sum(c.ok for c in cells)
    return markdown_table(COLUMNS, map(_row, cells)) + f"\n\n{met} of {len(cells)} cells {MET}.\n"


def run(
    rates: list[float],
    bursts: list[float],
    latencies: list[float],
    paces: list[float],
    seconds: float,
    markdown: str | None,
    spin: float = SPIN_S,
    nights: int = 1,
) -> int:
    if nights < 1:
        raise ValueError("--nights must be at least 1")
    measured: list[NightsOfACell[IdealCell]] = []
    for rate in rates:
        for burst in bursts:
            for latency in latencies:
                for pace in paces:
                    cell_nights = []
                    for night in range(nights):
                        err.print(
                            f"rate {rate:g}/s burst {burst:g} latency {latency:g} ms, paced at {pace:.0%}"
                            + (f" (night {night + 1} of {nights})" if nights > 1 else "")
                            + " ..."
                        )
                        cell = ideal_cell(rate, burst, latency, pace, seconds, spin)
                        err.print(f"  {cell.share_of_limit:.1%} of the limit, {cell.steady_429:.2%} 429")
                        cell_nights.append(cell)
                    measured.append(NightsOfACell(tuple(cell_nights)))
    if nights > 1:
        return _print_nights(measured, markdown)
    cells = [c.first for c in measured]
    table = Table(title="an ideal pacer told the limit (measured at the server)", title_justify="left")
    for column, _ in COLUMNS:
        table.add_column(column, justify="right")
    for c in cells:
        table.add_row(*_row(c)[:-1], verdict(c.ok))
    out.print(table)
    out.print(f"{sum(c.ok for c in cells)} of {len(cells)} cells {MET}")
    if markdown:
        Path(markdown).write_text(_markdown(cells), encoding="utf-8")
    return 0


# The several-nights table's columns (name, markdown alignment), in the order of ``_nights_row``.
NIGHTS_COLUMNS = (
    ("rate/s", "---:"),
    ("burst", "---:"),
    ("latency", "---:"),
    ("paced at", "---:"),
    ("median % of limit", "---:"),
    ("lowest", "---:"),
    ("median % 429", "---:"),
    ("late p99, worst", "---:"),
    ("met", "---"),
    ("nights (% of limit, % 429)", "---"),
)


def _nights_row(c: NightsOfACell[IdealCell]) -> list[str]:
    first = c.first
    return [
        f"{first.rate:g}",
        f"{first.burst:g}",
        f"{first.latency_ms:g} ms",
        f"{first.pace:.0%}",
        f"{c.median_share:.1%}",
        f"{c.lowest_share:.1%}",
        f"{c.median_429:.2%}",
        f"{max(n.late_p99_ms for n in c.nights):.3f} ms",
        f"{c.met} of {len(c.nights)}",
        ", ".join(f"{n.share_of_limit:.1%} ({n.steady_429:.2%})" for n in c.nights),
    ]


def _print_nights(cells: list[NightsOfACell[IdealCell]], markdown: str | None) -> int:
    title = "an ideal pacer told the limit, several nights a cell"
    return print_nights(title, NIGHTS_COLUMNS, _nights_row, cells, markdown)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.ideal", description=__doc__)
    parser.add_argument("--rates", default="20,50,200,500")
    parser.add_argument("--bursts", default="1")
    parser.add_argument("--latencies", default="0,20,200")
    parser.add_argument("--pace", default="0.96", help="shares of the limit to send at, e.g. 0.95,0.9")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument(
        "--spin-ms", type=float, default=SPIN_S * 1000, help="the last moment before each send, spun (ms)"
    )
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--nights", type=int, default=1, help="each cell and pace this many nights in turn")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return run(
            _floats(args.rates),
            _floats(args.bursts),
            _floats(args.latencies),
            _floats(args.pace),
            args.seconds,
            args.markdown,
            args.spin_ms / 1000,
            args.nights,
        )
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
