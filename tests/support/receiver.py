"""A real HTTP receiver of notifications on 127.0.0.1 (every request recorded), canary
credentials, and ``membersync`` run as a subprocess: shared by the notification and per-store
report tests."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from repo_root import MEMBERSYNC, REPO

USERNAME = "canary-user-7Kq"
PASSWORD = "Cn4ry+P@ss/wörd 91!"
HOOK_TOKEN = "hooktoken-Zr81xQ"  # a secret in the notification URL's path, as Slack/Teams URLs hold


# --- a real receiver --------------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.raw))

    def fields(self) -> dict[str, str]:
        """The body's ``key: value`` lines."""
        lines = str(self.json["message"]).splitlines()
        return dict(line.split(": ", 1) for line in lines)


@dataclass
class Receiver:
    port: int
    status: int = 200
    got: list[Received] = field(default_factory=list)

    def url(self, path: str = f"/hook/{HOOK_TOKEN}") -> str:
        return f"json://127.0.0.1:{self.port}{path}"


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver.got.append(Received(self.path, dict(self.headers.items()), raw))
            self.send_response(receiver.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest's output clean
            pass

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box = Receiver(port=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(box))
    box.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box
    finally:
        server.shutdown()
        server.server_close()


# --- running membersync ------------------------------------------------------------------------------


def base_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMBERSYNC_", "PREFECT_"))}
    env.update(
        MEMBERSYNC_DATA_DIR=str(data_dir),
        MEMBERSYNC_USERNAME=USERNAME,
        MEMBERSYNC_PASSWORD=PASSWORD,
        MEMBERSYNC_PREFECT="off",  # the same night without Prefect's start-up: these tests are about failures
        MEMBERSYNC_BUILD="off",
        NO_PROXY="127.0.0.1,localhost",
        COLUMNS="200",
    )
    env.update(extra)
    return env


def membersync(*args: str, env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    cmd = [*MEMBERSYNC, *args]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300, **kw)
