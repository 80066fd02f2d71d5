"""``membersync serve`` in a child process for the tests that need a scheduled night."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from repo_root import MEMBERSYNC

REPO = Path(__file__).resolve().parents[2]


class Lines:
    """A child's stderr, collected by a thread (it writes far more than a pipe buffer holds)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, alive: Callable[[], bool]) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive():
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            time.sleep(0.2)
        raise AssertionError(f"serve never printed /{pattern}/:\n{self.text()[-3000:]}")


@contextmanager
def running_serve(
    env: dict[str, str], interval: int | None = None, schedule: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], Lines]]:
    """``membersync serve`` every ``interval`` seconds, or with ``schedule``'s options
    (``--cron ... --timezone ...``)."""
    args = ["--interval", str(interval)] if interval is not None else list(schedule)
    proc = subprocess.Popen(
        [*MEMBERSYNC, "serve", *args],
        env=env,
        cwd=REPO,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        yield proc, Lines(proc.stderr)
    finally:
        # SIGINT to serve alone: its runner pauses the deployment on the server, then serve stops
        # the server itself (a signal to the whole group would kill the server first).
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
