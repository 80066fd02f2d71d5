"""A benchmark stopped from outside (SIGTERM: a CI's timeout, ``kill``) leaves no process behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

# Starts a sandbox as the benchmarks do, prints its URL, and waits to be stopped.
HOLDER = """
import time
from membersync.flows.benchmarks.sync import sandbox_process
with sandbox_process(20) as url:
    print(url, flush=True)
    time.sleep(600)
"""


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/_sandbox/stats", timeout=2)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_case_a_benchmark_stopped_by_a_signal_stops_its_sandbox(signum: int) -> None:
    """SIGTERM used to end the benchmark's Python at once, without its ``finally``: the sandbox it
    had started went on serving, an orphan. Now the signal unwinds, and the sandbox is stopped."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        url = holder.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        assert _answers(url)
        holder.send_signal(signum)
        assert holder.wait(timeout=30) != 0  # stopped by the signal, not finished
        deadline = time.monotonic() + 10
        while _answers(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _answers(url), "the benchmark's sandbox outlived it"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
