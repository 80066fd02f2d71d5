"""What any client could hold at a token bucket: a pacer that knows the limit, against the sandbox.

The rate matrix (:func:`membersync.flows.benchmarks.sync.run_rate_matrix`) measures our night,
which must *find* the server's limit. This measures the other side of the question: sent at a
fixed share of a limit it is told, as evenly as a dedicated thread can send, how many requests
does the server refuse? Where even this pacer draws >= 1 % 429s at 95 % of the limit, no client
can meet the issue's cell on this server and host: the refusals come from how unevenly requests
reach the server's bucket (its own event loop, the loopback, the host's scheduling), not from a
client's pacing, which is measured here too (how late each request went to its socket).

The pacer has nothing of ours on its path: one thread sends prebuilt HTTP/1.1 GETs of the night's
per-client reads on a pool of keep-alive sockets, each at ``t0 + k / pace`` (slept to within
``SPIN_S`` of it, then spun), and one thread reads the answers (a selector; status and
``Content-Length``) and hands the sockets back. It never retries: a refused request is counted,
not sent again. The server's own counters, over the same span as the rate matrix (from the 6th
second to the last whole one), give the share of the limit and of 429s::

    python -m membersync.flows.benchmarks.ideal --rates 20,50,200,500 --bursts 1 --pace 0.96
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import selectors
import socket
import statistics
import sys
import threading
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
    sandbox_process,
    server_share,
    verdict,
)
from rich.console import Console
from rich.table import Table

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

SPIN_S = 0.004  # the last moment before each send is spun, not slept (a sleep wakes ~0.1-1 ms late)
SKIP_S = 5  # seconds after the first request not measured (as in the rate matrix)
# The night's per-client reads whose only parameter is the client (a transaction history with
# no dates is the whole history): each request of the pacer is one of them, in turn.
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
        return self.share_of_limit >= 0.95 and self.steady_429 < 0.01


class _Answers:
    """Reads the answers on the pacer's sockets (one thread) and hands each socket back once its
    answer is whole; counts statuses."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.free: collections.deque[socket.socket] = collections.deque()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.lock = threading.Lock()
        self.pending = 0
        self._buffers: dict[socket.socket, bytearray] = {}
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ideal-answers", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)

    def sent_on(self, sock: socket.socket) -> None:
        with self.lock:
            self.pending += 1
            self._buffers[sock] = bytearray()
            self.selector.register(sock, selectors.EVENT_READ)

    def _run(self) -> None:
        try:
            self._read()
        except BaseException as exc:  # handed to the sender, which stops on it
            self.error = exc

    def _read(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                empty = not self._buffers
            if empty:
                time.sleep(0.001)
                continue
            for key, _ in self.selector.select(timeout=0.01):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise RuntimeError("the sandbox closed a connection")
                buffer = self._buffers[sock]
                buffer += chunk
                status = _whole_answer(buffer)
                if status is not None:
                    with self.lock:
                        self.selector.unregister(sock)
                        del self._buffers[sock]
                        self.statuses[status] += 1
                        self.pending -= 1
                        self.free.append(sock)


def _whole_answer(buffer: bytearray) -> int | None:
    """The status of the HTTP/1.1 answer in ``buffer`` once it is whole (headers and
    ``Content-Length`` bytes of body), else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if len(buffer) < end + 4 + length:
        return None
    return int(head[0].split()[1])


def _requests(url: str, count: int, auth: tuple[str, str]) -> list[bytes]:
    """``count`` prebuilt GETs, the night's per-client reads in turn over the sandbox's clients."""
    search = httpx.get(
        f"{url}{catalogue.SEARCH.path}",
        params={"modifiedSince": "2000-01-01T00:00:00", "pageSize": 500},
        auth=auth,
        timeout=30,
    )
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


def pace_at(
    url: str, pace: float, seconds: float, latency: float, auth: tuple[str, str] = (USERNAME, PASSWORD)
) -> Paced:
    """Send at ``pace`` req/s for ``seconds``, each request at ``t0 + k / pace``, to a server that
    answers after ``latency`` s, and wait for every answer."""
    requests = _requests(url, int(pace * seconds), auth)
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    answers = _Answers()
    # Enough keep-alive connections for the pace at the latency, opened before the first send.
    opened = [_connect(address) for _ in range(max(8, int(pace * (latency + 0.05) * 3)))]
    answers.free.extend(opened)
    answers.start()
    late: list[float] = []
    interval = 1.0 / pace
    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)  # the reader must not hold the sender off for 5 ms
    try:
        t0 = time.perf_counter() + 0.2
        for k, request in enumerate(requests):
            due = t0 + k * interval
            if answers.error is not None:
                raise RuntimeError(f"reading the answers failed: {answers.error!r}")
            with answers.lock:
                sock = answers.free.popleft() if answers.free else None
            if sock is None:  # every connection busy: one more, opened before its due time
                sock = _connect(address)
                opened.append(sock)
            wait = due - time.perf_counter()
            if wait > SPIN_S:
                time.sleep(wait - SPIN_S)
            while time.perf_counter() < due:
                pass
            sock.sendall(request)
            late.append(time.perf_counter() - due)
            answers.sent_on(sock)
        deadline = time.perf_counter() + 30
        while answers.pending and answers.error is None:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{answers.pending} answers did not come within 30 s")
            time.sleep(0.01)
        if answers.error is not None:
            raise RuntimeError(f"reading the answers failed: {answers.error!r}")
    finally:
        sys.setswitchinterval(previous)
        answers.stop()
        for sock in opened:
            sock.close()
    return Paced(late, dict(answers.statuses))


def ideal_cell(rate: float, burst: float, latency_ms: float, pace: float, seconds: float) -> IdealCell:
    clients = 500
    with sandbox_process(clients, rate=rate, latency_ms=latency_ms, burst=burst) as url:
        before = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
        time.sleep(1.5)  # the ready probe's token is back, whatever the bucket's size
        paced = pace_at(url, pace * rate, seconds, latency_ms / 1000)
        after = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
    for key in ("passed_per_second", "refused_per_second"):
        for second, count in before[key].items():
            after[key][second] -= count  # the ready probe is not the pacer's
    share, _night_429, steady_429, _span = server_share(after, rate, skip_s=SKIP_S)
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


COLUMNS = (
    "rate/s",
    "burst",
    "latency",
    "paced at",
    "sent",
    "% of limit",
    "% 429",
    "late p50",
    "late p99",
    "late max",
    "met",
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
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---:|" * (len(COLUMNS) - 1) + "---|"]
    lines += ["| " + " | ".join(_row(c)) + " |" for c in cells]
    met = sum(c.ok for c in cells)
    lines += ["", f"{met} of {len(cells)} cells {MET}.", ""]
    return "\n".join(lines)


def run(
    rates: list[float],
    bursts: list[float],
    latencies: list[float],
    paces: list[float],
    seconds: float,
    markdown: str | None,
) -> int:
    cells = []
    for rate in rates:
        for burst in bursts:
            for latency in latencies:
                for pace in paces:
                    err.print(
                        f"rate {rate:g}/s burst {burst:g} latency {latency:g} ms, paced at {pace:.0%} ..."
                    )
                    cell = ideal_cell(rate, burst, latency, pace, seconds)
                    err.print(f"  {cell.share_of_limit:.1%} of the limit, {cell.steady_429:.2%} 429")
                    cells.append(cell)
    table = Table(title="an ideal pacer told the limit (measured at the server)", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for c in cells:
        table.add_row(*_row(c)[:-1], verdict(c.ok))
    out.print(table)
    out.print(f"{sum(c.ok for c in cells)} of {len(cells)} cells {MET}")
    if markdown:
        Path(markdown).write_text(_markdown(cells), encoding="utf-8")
    return 0


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.ideal", description=__doc__)
    parser.add_argument("--rates", default="20,50,200,500")
    parser.add_argument("--bursts", default="1")
    parser.add_argument("--latencies", default="0,20,200")
    parser.add_argument("--pace", default="0.96", help="shares of the limit to send at, e.g. 0.95,0.9")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return run(
            _floats(args.rates),
            _floats(args.bursts),
            _floats(args.latencies),
            _floats(args.pace),
            args.seconds,
            args.markdown,
        )
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
