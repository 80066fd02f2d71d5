"""``membersync bench``: throughput, CPU per request, 429s, peak memory, Prefect overhead.

Every scenario runs the sandbox in its **own process** (``membersync sandbox``), so its CPU is
not ours, and the sync in a **child process** (``python -m membersync.flows.benchmarks.sync child``), which
reports its own CPU time (``time.process_time``), peak RSS (``getrusage``) and the client's
request counts (``ClientStats``) as one JSON line. Scenarios:

* ``unlimited``: the sandbox with no rate limit and no latency, one full night per client count
  (default 10,000): requests/s end to end (fetch, parse, land; the warehouse build is not
  counted), our CPU per request, peak RSS. Targets: >= 1,000 req/s, <= 0.6 ms CPU/request,
  RSS flat as the client count grows.
* ``limited``: 20 ms latency, 200 req/s per credential: server utilization (answered, non-429
  requests/s over 200) and the share of requests answered 429. Targets: >= 85 %, < 5 %.
* ``prefect``: the same small night through the Prefect flow (on the ephemeral server, warmed
  up first) and without Prefect: the CPU Prefect adds, per task run.

``--sandbox-only`` runs the sandbox engineer's own benchmark instead
(:mod:`membersync.flows.benchmarks.sandbox`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import httpx
from membersync.flows.pool.schedule import free_port, stop_process
from membersync.warehouse.exports.table_print import TableRows, print_table
from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

USERNAME = "bench"
PASSWORD = "bench-password"  # the sandbox's own throwaway credential, never a real one
LIMITED_RATE = 200.0
LIMITED_LATENCY_MS = 20.0
LIMITED_CLIENTS = 800
PREFECT_CLIENTS = 2_000


# --- the sandbox in its own process -----------------------------------------------------------------


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the block runs, a SIGTERM raises SystemExit, so that the ``finally`` clauses stop the
    processes the benchmark started (the sandbox, a night's child: ``subprocess.run`` kills its
    child on any exception). By default a SIGTERM ends Python at once and orphans them. Only where
    no handler is in place yet (an outer block's, pytest's, Prefect's) and in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sandbox_process(
    clients: int,
    *,
    rate: float = 0.0,
    latency_ms: float = 0.0,
    burst: float | None = None,
    announce_limits: bool = False,
    window: float = 0.0,
    max_in_flight: int = 0,
) -> Iterator[str]:
    """A ``membersync sandbox`` subprocess on loopback; yields its URL once it answers."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "membersync.flows.cli.commands",
        "sandbox",
        "--port",
        str(port),
        "--clients",
        str(clients),
        "--rate",
        str(rate),
        "--latency-ms",
        str(latency_ms),
        *(["--burst", str(burst)] if burst is not None else []),
        *(["--announce-limits"] if announce_limits else []),
        *(["--window", str(window)] if window else []),
        *(["--max-in-flight", str(max_in_flight)] if max_in_flight else []),
    ]
    env = {**os.environ, "SANDBOX_USERNAME": USERNAME, "SANDBOX_PASSWORD": PASSWORD}
    with _sigterm_unwinds():
        process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            yield _ready_url(process, port)
        finally:
            stop_process(process)


def _ready_url(process: subprocess.Popen[bytes], port: int) -> str:
    """The sandbox's URL once it answers (it may take a while to generate its clients: it
    serves once they are). Asked on its stats path, which no limit counts: the night's first
    request is the first its limits see (a fixed window begins with it, as it would a night's)."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 1800  # 100,000 generated clients take a while
    while True:
        if process.poll() is not None:
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"the sandbox exited with code {process.returncode}: {stderr[-500:]}")
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.get(f"{url}/_sandbox/stats", timeout=5)
            if answer.status_code == 200:
                return url
        if time.monotonic() > deadline:
            raise RuntimeError("the sandbox did not start in time")
        time.sleep(0.5)


# --- the sync in a child process ------------------------------------------------------------------------


@dataclass
class Measured:
    clients: int
    requests: int
    retries: int
    status_429: int
    by_status: dict[str, int]
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    task_runs: int = 0

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.cpu_s / self.requests if self.requests else 0.0

    @property
    def answered_ok_rps(self) -> float:
        ok = sum(v for k, v in self.by_status.items() if k != "429")
        return ok / self.wall_s if self.wall_s else 0.0


def run_child(
    url: str,
    *,
    prefect: bool,
    timeout: float,
    extra_env: dict[str, str] | None = None,
    data_dir: Path | None = None,
    wrapper: Sequence[str] = (),
) -> Measured:
    """One full night against ``url`` in a fresh process, and a fresh data dir unless ``data_dir``
    (a previous night's: its state, the rate it found included); its own figures. ``wrapper``
    runs the process under another command (a profiler: ``py-spy record ... --``)."""
    with tempfile.TemporaryDirectory(prefix="membersync-bench-") as tmp:
        env = {
            **os.environ,
            "MEMBERSYNC_BASE_URL": url,
            "MEMBERSYNC_USERNAME": USERNAME,
            "MEMBERSYNC_PASSWORD": PASSWORD,
            "MEMBERSYNC_DATA_DIR": str(data_dir or Path(tmp) / "data"),
            "PREFECT_HOME": str(Path(tmp) / "prefect"),
            **(extra_env or {}),
        }
        cmd = [*wrapper, sys.executable, "-m", "membersync.flows.benchmarks.sync", "child"]
        cmd += ["--prefect"] if prefect else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the sync failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
        line = [x for x in proc.stdout.splitlines() if x.startswith("{")][-1]
        return Measured(**json.loads(line))


def child_main(prefect: bool) -> int:
    """Run one full night (no warehouse build), print our own figures as one JSON line."""

    from membersync.extract.settings import ServiceSettings, Settings, env_name
    from membersync.flows.night import nightly
    from membersync.flows.night.options import SyncOptions
    from membersync.warehouse.landing.paths import DataDir

    config = Settings.load()
    settings = ServiceSettings.from_settings(config)
    data_dir = DataDir.from_settings(config)
    options = replace(SyncOptions.from_settings(config), build=False)
    night = dt.date.today()
    if prefect:
        os.environ[env_name("build")] = "off"  # the flow reads the environment
        nightly.prepare_prefect_env()
        from membersync.flows.night import prefect_flow
        from prefect import flow

        @flow(name="membersync-bench-warmup", persist_result=False)
        def warm_up() -> None:  # starts the ephemeral server, so its start is not measured
            return None

        warm_up()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = asyncio.run(prefect_flow.nightly_sync(night=night, full=True))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        summary = nightly.summary_from_flow_result(result)
        task_runs = summary.batches + 4  # configuration, discovery, commit, build
    else:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        summary = nightly.run_night(settings, data_dir, night, full=True, options=options)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        task_runs = 0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    figures = Measured(
        clients=summary.clients,
        requests=summary.requests,
        retries=summary.retries,
        status_429=summary.status_429,
        by_status=summary.by_status,
        wall_s=wall,
        cpu_s=cpu,
        peak_rss_mb=peak_kb / 1024,
        task_runs=task_runs,
    )
    print(json.dumps(figures.__dict__))  # noqa: T201 - the parent reads this line
    return 0


# --- the report ---------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[red]MISSED[/]"


def run_bench_cli(clients: list[int], sandbox_only: bool = False) -> int:
    """``membersync bench``: run the scenarios and print the figures against their targets."""
    if sandbox_only:
        return sandbox_only_bench(clients)

    table = TableRows(["scenario", "figure", "value", "target", ""], "membersync bench", ("value",))
    # --clients 0: skip this scenario
    unlimited = [_bench_unlimited(table, count) for count in clients if count > 0]
    _memory_growth_row(table, unlimited)
    _bench_limited(table)
    _bench_prefect(table)
    table.print(out)
    return 0


def _bench_unlimited(table: TableRows, count: int) -> Measured:
    """One full night of ``count`` clients against a sandbox without limit or latency."""
    err.print(f"[bold]unlimited sandbox, {count:,} clients[/]: starting the sandbox ...")
    with sandbox_process(count) as url:
        err.print("  syncing one full night ...")
        got = run_child(url, prefect=False, timeout=6 * 3600)
    name = f"unlimited, {count:,} clients"
    table.add_row(name, "requests", f"{got.requests:,}", "", "")
    table.add_row("", "wall time", f"{got.wall_s:,.1f} s", "", "")
    table.add_row("", "requests/s end to end", f"{got.rps:,.0f}", ">= 1,000", verdict(got.rps >= 1000))
    table.add_row(
        "",
        "our CPU per request",
        f"{got.cpu_ms_per_request:.3f} ms",
        "<= 0.6 ms",
        verdict(got.cpu_ms_per_request <= 0.6),
    )
    table.add_row("", "peak RSS", f"{got.peak_rss_mb:,.0f} MB", "flat", "")
    err.print(
        f"  {got.rps:,.0f} req/s, {got.cpu_ms_per_request:.3f} ms CPU/request, {got.peak_rss_mb:,.0f} MB"
    )
    return got


def _memory_growth_row(table: TableRows, unlimited: list[Measured]) -> None:
    """Peak RSS of the largest unlimited night over the smallest's: flat means < x1.5."""
    if len(unlimited) > 1:
        small, large = unlimited[0], unlimited[-1]
        growth = large.peak_rss_mb / small.peak_rss_mb if small.peak_rss_mb else 0.0
        table.add_row(
            "memory",
            f"peak RSS x{large.clients / max(small.clients, 1):.0f} clients",
            f"x{growth:.2f}",
            "flat",
            verdict(growth < 1.5),
        )


def _bench_limited(table: TableRows) -> None:
    """A night against a rate-limited, slow sandbox: how much of the limit it used, how politely."""
    err.print(
        f"[bold]limited sandbox[/] ({LIMITED_LATENCY_MS:.0f} ms latency, {LIMITED_RATE:.0f} req/s), "
        f"{LIMITED_CLIENTS:,} clients ..."
    )
    with sandbox_process(LIMITED_CLIENTS, rate=LIMITED_RATE, latency_ms=LIMITED_LATENCY_MS) as url:
        limited = run_child(url, prefect=False, timeout=3600)
    utilization = limited.answered_ok_rps / LIMITED_RATE
    share_429 = limited.status_429 / limited.requests if limited.requests else 0.0
    table.add_row("limited 200 req/s, 20 ms", "requests", f"{limited.requests:,}", "", "")
    table.add_row("", "server utilization", f"{utilization:.1%}", ">= 85 %", verdict(utilization >= 0.85))
    table.add_row("", "answered 429", f"{share_429:.2%}", "< 5 %", verdict(share_429 < 0.05))
    table.add_row("", "retries", f"{limited.retries:,}", "", "")


def _bench_prefect(table: TableRows) -> None:
    """The CPU the Prefect flow adds to the same night, at two batch sizes: two task-run counts
    give the cost per task run (the slope) and the fixed cost of a flow run (the intercept)."""
    err.print(f"[bold]Prefect overhead[/]: {PREFECT_CLIENTS:,} clients, with and without the flow ...")
    added: dict[int, float] = {}  # task runs -> CPU the flow added over the plain night
    with sandbox_process(PREFECT_CLIENTS) as url:
        for size in ("250", "25"):  # 12 and 84 task runs
            env = {"MEMBERSYNC_BATCH_SIZE": size}
            plain = run_child(url, prefect=False, timeout=3600, extra_env=env)
            flowed = run_child(url, prefect=True, timeout=3600, extra_env=env)
            added[flowed.task_runs] = extra = flowed.cpu_s - plain.cpu_s
            table.add_row(
                "Prefect" if len(added) == 1 else "",
                f"{size} clients per batch ({flowed.task_runs} task runs)",
                f"{plain.cpu_s:.1f} s plain, {flowed.cpu_s:.1f} s flow",
                "",
                "",
            )
            table.add_row(
                "",
                "  CPU the flow added",
                f"{extra:.2f} s ({1000 * extra / max(flowed.requests, 1):.3f} ms/request)",
                "",
                "",
            )
    (few, few_cpu), (many, many_cpu) = sorted(added.items())
    slope = (many_cpu - few_cpu) / (many - few)
    table.add_row("", "CPU per extra task run (slope)", f"{1000 * slope:.1f} ms", "", "")
    table.add_row("", "fixed CPU per night (flow run)", f"{few_cpu - slope * few:.2f} s", "", "")


# --- politeness at the limit: the rate matrix ---------------------------------------------------------


MET = "at >= 95 % of the limit with < 1 % answered 429 (both after the first 5 s)"


def meets(share_of_limit: float, steady_429: float) -> bool:
    """The issue's line (:data:`MET`): what the
    server let through over the measured span, and the share of it refused."""
    return share_of_limit >= 0.95 and steady_429 < 0.01


@dataclass(frozen=True)
class RateCell:
    rate: float
    burst: float
    latency_ms: float
    announce: bool
    requests: int
    retries: int
    share_of_limit: float  # passed requests/s at the server (first 5 s and last second excluded) / rate
    share_429: float  # of every request the server saw (the rate's discovery included)
    steady_429: float  # of the requests the server saw in the measured span
    seconds: float  # the measured span
    started_at: float | None = None  # req/s: the rate a previous night found (--next-night)

    @property
    def ok(self) -> bool:
        return meets(self.share_of_limit, self.steady_429)


def counts_since(stats: dict[str, Any], before: dict[str, Any], key: str) -> dict[int, int]:
    """The sandbox's per-second counter ``key`` less what it had counted ``before`` (non-zero only)."""
    earlier = before.get(key, {})
    counts = {int(k): v - earlier.get(k, 0) for k, v in stats[key].items()}
    return {k: v for k, v in counts.items() if v}


def server_share(
    stats: dict[str, Any], rate: float, skip_s: int = 5, before: dict[str, Any] | None = None
) -> tuple[float, float, float, float]:
    """(share of the limit, share answered 429 over the night and over the measured span, seconds
    measured) from the sandbox's own counters, less those taken ``before`` the night.

    The pace is what the server let through per second, from ``skip_s`` s after the first
    request to the last whole second (the night's tail, when few clients remain, is not pace).
    """
    # (What was counted before is not the night's: a ready probe, a search, or with --next-night
    # the night before. Seconds it leaves at 0 are left out.)
    counted_before = before or {}
    passed = counts_since(stats, counted_before, "passed_per_second")
    refused = counts_since(stats, counted_before, "refused_per_second")
    seconds = sorted(set(passed) | set(refused))
    if not seconds:
        return 0.0, 0.0, 0.0, 0.0
    first, last = seconds[0] + skip_s, seconds[-1] - 1
    span = last - first
    if span <= 0:
        raise RuntimeError("the night was too short to measure: give it more clients")
    through = sum(v for k, v in passed.items() if first <= k < last)
    refused_in_span = sum(v for k, v in refused.items() if first <= k < last)
    total = sum(passed.values()) + sum(refused.values())
    steady = refused_in_span / (through + refused_in_span) if through + refused_in_span else 0.0
    return through / span / rate, sum(refused.values()) / total, steady, float(span)


def rate_cell(
    rate: float, burst: float, latency_ms: float, seconds: float, announce: bool, next_night: bool = False
) -> RateCell:
    """One night against a sandbox limited to ``rate``/s with ``burst`` tokens and ``latency_ms``.

    With ``next_night``, two nights in one data dir: the first finds the rate and remembers it
    (``state/rate.json``), the second, the one measured, starts at it, as every night after a
    deployment's first does.
    """
    clients = max(20, int(rate * (seconds + 6) / 9.3))  # ~9.3 requests per client
    env = {"MEMBERSYNC_BATCHES_IN_FLIGHT": "4"}
    with (
        sandbox_process(
            clients, rate=rate, latency_ms=latency_ms, burst=burst, announce_limits=announce
        ) as url,
        tempfile.TemporaryDirectory(prefix="membersync-bench-nights-") as tmp,
    ):
        data_dir = Path(tmp) / "data" if next_night else None
        started_at = None
        if data_dir is not None:
            run_child(url, prefect=False, timeout=3600, extra_env=env, data_dir=data_dir)
            from membersync.flows.night.nightly import remembered_rate
            from membersync.warehouse.landing.paths import DataDir

            started_at = remembered_rate(DataDir(data_dir))
            if started_at is None:
                raise RuntimeError("the first night remembered no rate: nothing for the next to start at")
            # Nights are a day apart: the server's bucket is full again when the next begins (at
            # most 1 s here, burst <= rate). (The subtraction below keeps their counts apart.)
            time.sleep(2.0)
        httpx.get(f"{url}/_sandbox/stats", timeout=5)  # (warm: the sandbox counts from the night's start)
        before = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
        night = run_child(url, prefect=False, timeout=3600, extra_env=env, data_dir=data_dir)
        after = httpx.get(f"{url}/_sandbox/stats", timeout=5).json()
    share, share_429, steady_429, span = server_share(after, rate, before=before)
    return RateCell(
        rate,
        burst,
        latency_ms,
        announce,
        night.requests,
        night.retries,
        share,
        share_429,
        steady_429,
        span,
        started_at,
    )


def matrix_grid(
    rates: list[float], bursts: list[str], latencies: list[float], announced: bool
) -> list[tuple[float, float, float, bool]]:
    """The cells (rate, burst, latency, announced) of the matrix, each once: burst ``R`` is the
    rate itself, so at 20/s bursts ``20`` and ``R`` are one cell, measured once."""
    grid: list[tuple[float, float, float, bool]] = []
    for rate in rates:
        for burst_text in bursts:
            burst = rate if burst_text == "R" else float(burst_text)
            for latency in latencies:
                for announce in (False, True) if announced else (False,):
                    if (rate, burst, latency, announce) not in grid:
                        grid.append((rate, burst, latency, announce))
    return grid


def run_rate_matrix(
    rates: list[float],
    bursts: list[str],
    latencies: list[float],
    seconds: float,
    markdown: str | None,
    announced: bool = False,
    next_night: bool = False,
    nights: int = 1,
) -> int:
    """``membersync bench --rate-matrix``: % of the limit held at the server, % 429, retries;
    with ``next_night``, of a night that starts at the rate the night before it found; with
    ``nights`` > 1, each cell that many nights in turn, summed up (:class:`NightsOfACell`)."""
    if nights < 1:
        raise ValueError("--nights must be at least 1")
    measured_cells = [
        _measure_cell(rate, burst, latency, announce, seconds, next_night, nights)
        for rate, burst, latency, announce in matrix_grid(rates, bursts, latencies, announced)
    ]
    if nights > 1:
        return _print_nights(measured_cells, markdown)
    return _print_one_night([c.first for c in measured_cells], markdown)


def _measure_cell(
    rate: float, burst: float, latency: float, announce: bool, seconds: float, next_night: bool, nights: int
) -> NightsOfACell[RateCell]:
    """One cell of the matrix, ``nights`` nights in turn, each said as it ends."""
    measured: list[RateCell] = []
    for night in range(nights):
        err.print(
            f"rate {rate:g}/s burst {burst:g} latency {latency:g} ms "
            f"{'announced' if announce else 'silent'}"
            + (f" (night {night + 1} of {nights})" if nights > 1 else "")
            + " ..."
        )
        cell = rate_cell(rate, burst, latency, seconds, announce, next_night)
        err.print(
            f"  {cell.share_of_limit:.1%} of the limit, {cell.steady_429:.2%} 429 "
            f"({cell.share_429:.2%} over the night)"
        )
        measured.append(cell)
    return NightsOfACell(tuple(measured))


def _print_one_night(cells: list[RateCell], markdown: str | None) -> int:
    """The matrix of one night a cell: the table, how many cells met the line, the Markdown."""
    columns = (
        "rate/s",
        "burst",
        "latency",
        "headers",
        "requests",
        "% of limit",
        "% 429",
        "% 429 night",
        "retries",
        "",
    )
    # the "started at" column only when some night started at a rate found the night before
    started = any(c.started_at is not None for c in cells)
    header = [*columns[:4], *(("started at",) if started else ()), *columns[4:]]
    table = TableRows(header, "politeness at the limit (measured at the server)", tuple(header))
    for c in cells:
        table.add_row(
            f"{c.rate:g}",
            f"{c.burst:g}",
            f"{c.latency_ms:g} ms",
            "announced" if c.announce else "silent",
            *((_started(c),) if started else ()),
            f"{c.requests:,}",
            f"{c.share_of_limit:.1%}",
            f"{c.steady_429:.2%}",
            f"{c.share_429:.2%}",
            f"{c.retries:,}",
            verdict(c.ok),
        )
    table.print(out)
    met = sum(c.ok for c in cells)
    out.print(f"{met} of {len(cells)} cells {MET}")
    if markdown:
        Path(markdown).write_text(_rate_markdown(cells), encoding="utf-8")
    return 0


class CountedNight(Protocol):
    """A night of one cell as the server counted it."""

    @property
    def share_of_limit(self) -> float: ...
    @property
    def steady_429(self) -> float: ...
    @property
    def ok(self) -> bool: ...


M = TypeVar("M", bound=CountedNight)


@dataclass(frozen=True)
class NightsOfACell(Generic[M]):
    """One cell measured several nights in turn (``--nights``): one 15-s night is a coin toss for
    a cell near the line (50/1/0 ms read 89.5-97.1 % over 16 nights of the same code), so a change
    is judged on the median and on how many nights met the cell."""

    nights: tuple[M, ...]

    @property
    def first(self) -> M:
        return self.nights[0]

    @property
    def median_share(self) -> float:
        return statistics.median(c.share_of_limit for c in self.nights)

    @property
    def lowest_share(self) -> float:
        return min(c.share_of_limit for c in self.nights)

    @property
    def median_429(self) -> float:
        return statistics.median(c.steady_429 for c in self.nights)

    @property
    def met(self) -> int:
        return sum(c.ok for c in self.nights)

    def shares(self) -> str:
        return ", ".join(f"{c.share_of_limit:.1%}" for c in self.nights)


# The several-nights table's columns, as the terminal and the markdown tables both head them
# (with the markdown's alignment: numbers right, words left), in the order of ``_nights_row``.
_NIGHTS_COLUMNS = (
    ("rate/s", "---:"),
    ("burst", "---:"),
    ("latency", "---:"),
    ("limit headers", "---"),
    ("median % of limit", "---:"),
    ("lowest", "---:"),
    ("median % 429", "---:"),
    ("met", "---"),
    ("nights (% of limit)", "---"),
)


def _print_nights(cells: list[NightsOfACell[RateCell]], markdown: str | None) -> int:
    title = "politeness at the limit, several nights a cell"
    return print_nights(title, _NIGHTS_COLUMNS, _nights_row, cells, markdown)


def print_nights(
    title: str,
    columns: Sequence[tuple[str, str]],
    row: Callable[[NightsOfACell[M]], list[str]],
    cells: Sequence[NightsOfACell[M]],
    markdown: str | None,
) -> int:
    """A several-nights table (``--nights``) on the terminal, and as Markdown to ``markdown``:
    ``columns`` (each a name and its markdown alignment) over each cell's ``row``."""
    header = [column for column, _ in columns]
    print_table(header, [tuple(row(c)) for c in cells], title=title, right_aligned=tuple(header), out=out)
    out.print(nights_footer(cells))
    if markdown:
        Path(markdown).write_text(nights_markdown(columns, row, cells), encoding="utf-8")
    return 0


def _nights_row(c: NightsOfACell[RateCell]) -> list[str]:
    """A cell's fields, as the terminal table and the markdown table both show them."""
    first = c.first
    return [
        f"{first.rate:g}",
        f"{first.burst:g}",
        f"{first.latency_ms:g} ms",
        "announced" if first.announce else "silent",
        f"{c.median_share:.1%}",
        f"{c.lowest_share:.1%}",
        f"{c.median_429:.2%}",
        f"{c.met} of {len(c.nights)}",
        c.shares(),
    ]


def nights_footer(cells: Sequence[NightsOfACell[Any]]) -> str:
    every = sum(c.met == len(c.nights) for c in cells)
    most = sum(2 * c.met > len(c.nights) for c in cells)
    return f"{every} of {len(cells)} cells met in every night, {most} in most; met: {MET}"


def _nights_markdown(cells: list[NightsOfACell[RateCell]]) -> str:
    return nights_markdown(_NIGHTS_COLUMNS, _nights_row, cells)


def nights_markdown(
    columns: Sequence[tuple[str, str]],
    row: Callable[[NightsOfACell[M]], list[str]],
    cells: Sequence[NightsOfACell[M]],
) -> str:
    return markdown_table(columns, map(row, cells)) + "\n\n" + nights_footer(cells) + ".\n"


def markdown_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of ``rows`` under ``columns`` (each a name and its alignment)."""
    head = [name for name, _ in columns]
    alignment = "|" + "|".join(align for _, align in columns) + "|"
    lines = ["| " + " | ".join(row) + " |" for row in (head, *rows)]
    lines.insert(1, alignment)
    return "\n".join(lines)


def _started(cell: RateCell) -> str:
    return f"{cell.started_at:.1f}/s" if cell.started_at is not None else ""


def _rate_markdown(cells: list[RateCell]) -> str:
    started = any(c.started_at is not None for c in cells)
    lines = [
        "| rate/s | burst | latency | limit headers | "
        + ("started at | " if started else "")
        + "requests | % of limit | % 429 | % 429 whole night | retries | met |",
        "|---:|---:|---:|---|" + ("---:|" if started else "") + "---:|---:|---:|---:|---:|---|",
    ]
    for c in cells:
        lines.append(
            f"| {c.rate:g} | {c.burst:g} | {c.latency_ms:g} ms | {'announced' if c.announce else 'silent'} "
            + (f"| {_started(c)} " if started else "")
            + f"| {c.requests:,} | {c.share_of_limit:.1%} | {c.steady_429:.2%} | {c.share_429:.2%} "
            f"| {c.retries:,} "
            f"| {'yes' if c.ok else 'no'} |"
        )
    met = sum(c.ok for c in cells)
    lines.append("")
    lines.append(f"{met} of {len(cells)} cells {MET}.")
    return "\n".join(lines) + "\n"


# --- the cost of exact history: whole histories against the window -----------------------------------


def run_history_cost(clients: int, change_share: float = 0.05) -> int:
    """``membersync bench --history-cost``: one full night, ~5 % of clients changed over HTTP,
    then the next night twice from copies of the same data dir: whole histories (the default)
    and the window (``MEMBERSYNC_WHOLE_HISTORY=off``). Requests and bytes of each."""
    import asyncio
    import shutil

    from membersync.extract.client import ServiceClient
    from membersync.extract.settings import ServiceSettings
    from membersync.flows.night.nightly import run_night
    from membersync.flows.night.options import SyncOptions
    from membersync.warehouse.landing.paths import DataDir
    from pydantic import SecretStr

    today = dt.date.today()
    with sandbox_process(clients) as url, tempfile.TemporaryDirectory(prefix="membersync-history-") as tmp:
        settings = ServiceSettings(url, SecretStr(USERNAME), SecretStr(PASSWORD))
        first = DataDir(Path(tmp) / "whole")
        err.print(f"[bold]history cost[/], {clients:,} clients: the full night ...")
        full = run_night(settings, first, today - dt.timedelta(days=1), options=SyncOptions(build=False))
        changed = asyncio.run(_change_clients(ServiceClient(url, USERNAME, PASSWORD), change_share))
        windowed_dir = DataDir(Path(tmp) / "window")
        shutil.copytree(first.root, windowed_dir.root)
        rows = []
        for label, data_dir, whole in (
            ("whole histories", first, True),
            ("window of 7 days", windowed_dir, False),
        ):
            err.print(f"  the next night, {label} ...")
            night = run_night(
                settings, data_dir, today, options=SyncOptions(build=False, whole_history=whole)
            )
            rows.append((label, night))
    header = ["history", "clients synced", "requests", "MB received", "bytes per client"]
    title = f"the next night after {changed:,} of {clients:,} clients changed"
    table = TableRows(header, title, tuple(header))
    table.add_row(
        "(the full night)", f"{full.clients:,}", f"{full.requests:,}", f"{full.bytes_received / 1e6:,.1f}", ""
    )
    for label, night in rows:
        table.add_row(
            label,
            f"{night.clients:,}",
            f"{night.requests:,}",
            f"{night.bytes_received / 1e6:,.2f}",
            f"{night.bytes_received / max(night.clients, 1):,.0f}",
        )
    table.print(out)
    return 0


async def _change_clients(client: Any, share: float) -> int:
    """A comment on ``share`` of the clients (each a write that moves lastModified)."""
    import random

    async with client:
        stores = await client.storelist()
        numbers: list[tuple[str, str]] = []
        employees: dict[str, str] = {}
        for store in stores:
            code = store["storecode"]
            staff = await client.employees(storecode=code)
            if staff:
                employees[code] = staff[0]["empNo"]
            async for page in client.search(storecode=code):
                numbers += [(c["clientNumber"], code) for c in page.items]
        picked = random.Random(7).sample(numbers, max(1, int(len(numbers) * share)))
        await asyncio.gather(
            *(
                client.insert_comment(clientNumber=n, empNo=employees[code], text="history cost")
                for n, code in picked
                if code in employees
            )
        )
        return len(picked)


def sandbox_only_bench(clients: list[int]) -> int:
    """The sandbox engineer's benchmark (the server alone), one row per client count."""
    from membersync.flows.benchmarks.sandbox import run_sandbox_bench

    results = []
    for count in clients:
        err.print(f"[bold]sandbox alone, {count:,} clients[/] ...")
        results.append(run_sandbox_bench(count))
    keys = list(dict.fromkeys(k for r in results for k in r))
    counts = [f"{count:,} clients" for count in clients]
    rows = [(key, *(str(r.get(key, "")) for r in results)) for key in keys]
    print_table(["figure", *counts], rows, title="sandbox only", right_aligned=tuple(counts), out=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.sync")
    sub = parser.add_subparsers(dest="command", required=True)
    child = sub.add_parser("child", help="(internal) one measured night; prints JSON")
    child.add_argument("--prefect", action="store_true")
    run = sub.add_parser("run", help="the whole benchmark (same as `membersync bench`)")
    run.add_argument("--clients", type=int, action="append")
    args = parser.parse_args(argv)
    if args.command == "child":
        return child_main(args.prefect)
    return run_bench_cli(args.clients or [10_000])


if __name__ == "__main__":
    sys.exit(main())
