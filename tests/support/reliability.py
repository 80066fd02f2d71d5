"""Helpers of the reliability scenarios: real ``membersync sync`` processes, kills, and health checks.

A :class:`Workspace` is one data dir + one Prefect home + the environment of a sync against a
sandbox. ``ws.sync()`` runs a night to the end; ``ws.start()`` returns a :class:`Running` sync
that a test may SIGKILL as a whole process group. Two ways to start a sync:

- ``how="exec"``: the console script ``membersync sync`` in a new session (what a user runs;
  pays Python's and Prefect's import time, ~3 s of CPU);
- ``how="fork"`` (default): the same CLI entry point in a child forked from a pre-imported
  parent (:mod:`sync_zygote`), also a new session. Used where a scenario starts dozens of syncs.

:func:`inspect` measures what the promises are about: Parquet under the published paths that
cannot be read, files no manifest names, temporary files, staging leftovers, duplicate keys per
committed night, and whether ``state.json`` runs ahead of the manifests.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from membersync.extract.sandbox.running import RunningSandbox
from membersync.models.tables import LANDED_BY_NAME as BY_NAME
from membersync.warehouse.landing.manifest import read_manifests
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import awaiting_sweep_file
from nights import TONIGHT

TESTS = Path(__file__).resolve().parent
MEMBERSYNC = Path(sys.executable).parent / "membersync"
TMP_MARKERS = (".tmp", "building-")


# --- processes ---------------------------------------------------------------------------------------


class Zygote:
    """The pre-imported parent of forked syncs (see :mod:`sync_zygote`). One per test session."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "sync_zygote.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        ready = self._read()
        if "ready" not in ready:
            raise RuntimeError(f"sync zygote did not start: {ready}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("sync zygote exited")
        return json.loads(line)  # type: ignore[no-any-return]

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            return self._read()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask({"op": "exit"})
        with contextlib.suppress(Exception):
            self.proc.wait(10)


_zygote: Zygote | None = None


def zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = Zygote()
        atexit.register(_zygote.close)
    return _zygote


@dataclass
class Outcome:
    """How a sync process ended: exit code (negative = killed by that signal), output, wall time."""

    status: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == 0

    def describe(self) -> str:
        head = f"exit {self.status} after {self.seconds:.1f} s"
        return f"{head}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def summary_value(self, item: str) -> str | None:
        """A value of the printed run summary table (``retries``, ``requests`` ...)."""
        for line in self.stdout.splitlines():
            cells = [c.strip() for c in line.strip().strip("│┃|").split("│")]
            if len(cells) == 2 and cells[0] == item:
                return cells[1]
        return None


class Running:
    """A sync in its own process group (session)."""

    def __init__(self, pid: int, out: Path, err: Path, started: float, popen: subprocess.Popen[bytes] | None):
        self.pid = pid
        self.out = out
        self.err = err
        self.started = started
        self.popen = popen
        self.status: int | None = None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def poll(self) -> int | None:
        if self.status is None:
            if self.popen is not None:
                self.status = self.popen.poll()
            else:
                self.status = zygote().ask({"op": "wait", "pid": self.pid, "timeout": 0})["status"]
        return self.status

    def wait(self, timeout: float = 600) -> Outcome:
        if self.status is None:
            if self.popen is not None:
                try:
                    self.status = self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.kill_group()
                    self.status = self.popen.wait(30)
                    raise
            else:
                self.status = zygote().ask({"op": "wait", "pid": self.pid, "timeout": timeout})["status"]
                if self.status is None:
                    self.kill_group()
                    zygote().ask({"op": "wait", "pid": self.pid, "timeout": 30})
                    raise TimeoutError(f"sync {self.pid} still running after {timeout} s (killed)")
        # A killed group may leave children (Prefect's server); make sure none outlives the test.
        self.kill_group()
        return Outcome(
            self.status,
            self.out.read_text(errors="replace"),
            self.err.read_text(errors="replace"),
            time.monotonic() - self.started,
        )


# --- the workspace --------------------------------------------------------------------------------------


def clean_environ() -> dict[str, str]:
    """This process's environment without any MEMBERSYNC_* / PREFECT_* setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MEMBERSYNC_", "PREFECT_"))}


@dataclass
class Workspace:
    root: Path
    base_url: str
    night: dt.date
    username: str = "sandbox"
    password: str = "sandbox"
    batch_size: int = 20
    extra_env: dict[str, str] = field(default_factory=dict)
    runs: int = 0

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "out").mkdir(exist_ok=True)

    @property
    def data_dir(self) -> DataDir:
        return DataDir((self.root / "data").resolve())

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    def env(self, **overrides: str) -> dict[str, str]:
        env = clean_environ()
        env.update(
            {
                "MEMBERSYNC_BASE_URL": self.base_url,
                "MEMBERSYNC_USERNAME": self.username,
                "MEMBERSYNC_PASSWORD": self.password,
                "MEMBERSYNC_DATA_DIR": str(self.data_dir.root),
                "MEMBERSYNC_PREFECT": "off",
                "MEMBERSYNC_BATCH_SIZE": str(self.batch_size),
                "PREFECT_HOME": str(self.prefect_home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
                "COLUMNS": "160",
                "NO_COLOR": "1",
                "TERM": "dumb",
            }
        )
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def argv(self, night: dt.date | None = None, full: bool = False) -> list[str]:
        args = ["sync", "--date", (night or self.night).isoformat(), "--no-progress"]
        return [*args, "--full"] if full else args

    def start(
        self,
        argv: list[str] | None = None,
        *,
        how: str = "fork",
        env: Mapping[str, str] | None = None,
        log_file: Path | None = None,
        rlimit_fsize: int | None = None,
    ) -> Running:
        self.runs += 1
        out = self.root / "out" / f"run{self.runs:03d}.out"
        err = self.root / "out" / f"run{self.runs:03d}.err"
        argv = argv if argv is not None else self.argv()
        env = dict(env) if env is not None else self.env()
        started = time.monotonic()
        if how == "exec":
            assert log_file is None, "log_file needs how='fork'"
            popen = subprocess.Popen(
                [str(MEMBERSYNC), *argv],
                env=env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out.open("wb"),
                stderr=err.open("wb"),
                start_new_session=True,
                preexec_fn=_fsize_limiter(rlimit_fsize) if rlimit_fsize else None,
            )
            return Running(popen.pid, out, err, started, popen)
        answer = zygote().ask(
            {
                "op": "spawn",
                "argv": argv,
                "env": env,
                "cwd": str(self.root),
                "stdout": str(out),
                "stderr": str(err),
                "log_file": str(log_file) if log_file else None,
                "log_level": "DEBUG" if log_file else None,
                "rlimit_fsize": rlimit_fsize,
            }
        )
        return Running(int(answer["pid"]), out, err, started, None)

    def sync(self, argv: list[str] | None = None, *, timeout: float = 600, **kw: Any) -> Outcome:
        return self.start(argv, **kw).wait(timeout)


def _fsize_limiter(limit: int) -> Any:
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


# --- what a data dir looks like -----------------------------------------------------------------------


@dataclass
class Health:
    unreadable: list[str] = field(default_factory=list)  # published Parquet that cannot be read
    missing: list[str] = field(default_factory=list)  # named by a manifest, not on disk
    orphans: list[str] = field(default_factory=list)  # published Parquet no manifest names
    temp_files: list[str] = field(default_factory=list)  # anything with a temporary name
    staging_files: list[str] = field(default_factory=list)  # leftovers of a run in landing/_staging
    duplicates: dict[str, int] = field(default_factory=dict)  # "night table" -> duplicate key count
    state_problems: list[str] = field(default_factory=list)  # state.json ahead of the manifests
    nights: list[dt.date] = field(default_factory=list)

    @property
    def duplicate_keys(self) -> int:
        return sum(self.duplicates.values())

    def problems(self, *, allow_staging: bool = False) -> list[str]:
        out = [f"unreadable Parquet: {p}" for p in self.unreadable]
        out += [f"manifest names a missing file: {p}" for p in self.missing]
        out += [f"orphan under a published path: {p}" for p in self.orphans]
        out += [f"temporary file left: {p}" for p in self.temp_files]
        if not allow_staging:
            out += [f"staging leftover: {p}" for p in self.staging_files]
        out += [f"duplicate keys: {k}: {n}" for k, n in self.duplicates.items() if n]
        out += self.state_problems
        return out


def inspect(data_dir: DataDir) -> Health:
    """Measure the data dir against the landing zone's promises (read-only)."""
    health = Health()
    root = data_dir.root
    if not root.exists():
        return health
    for path in root.rglob("*"):
        if any(mark in path.name for mark in TMP_MARKERS):
            health.temp_files.append(str(path.relative_to(root)))
    manifests = read_manifests(data_dir.manifests)
    health.nights = [m.snapshot_date for m in manifests]
    named: set[str] = set()
    for m in manifests:
        for table_name, files in [*m.tables.items(), ("_quarantine", m.quarantine)]:
            named.update(files.files)
            present = [f for f in files.files if (data_dir.landing / f).is_file()]
            health.missing += [f for f in files.files if f not in present]
            if table_name not in BY_NAME or not present:
                continue
            key = list(BY_NAME[table_name].key)
            rows = 0
            keys: set[tuple[Any, ...]] = set()
            for f in present:
                try:
                    data = pq.read_table(data_dir.landing / f, columns=key)
                except Exception:  # counted below as unreadable
                    continue
                rows += data.num_rows
                keys.update(zip(*(data.column(k).to_pylist() for k in key), strict=True))
            health.duplicates[f"{m.snapshot_date} {table_name}"] = rows - len(keys)
    # identity files a build kept for readers of the catalog it replaced: the next build removes them
    awaiting = awaiting_sweep_file(data_dir)
    if awaiting.is_file():
        named.update(f.removeprefix("landing/") for f in json.loads(awaiting.read_text()))
    for path in data_dir.landing.rglob("*.parquet") if data_dir.landing.exists() else ():
        relative = str(path.relative_to(data_dir.landing))
        if relative.startswith("_staging/"):
            continue
        if any(mark in path.name for mark in TMP_MARKERS):
            continue
        try:
            pq.read_table(path)
        except Exception:
            health.unreadable.append(relative)
        if relative not in named:
            health.orphans.append(relative)
    if data_dir.staging.exists():
        health.staging_files = [str(p.relative_to(root)) for p in data_dir.staging.rglob("*") if p.is_file()]
    health.state_problems = state_problems(data_dir, manifests)
    return health


def state_problems(data_dir: DataDir, manifests: list[Any] | None = None) -> list[str]:
    """``state.json`` must never be ahead of committed data (the manifests)."""
    manifests = read_manifests(data_dir.manifests) if manifests is None else manifests
    try:
        saved = json.loads(data_dir.state_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        return [f"state.json unreadable: {exc}"]
    committed = {m.snapshot_date.isoformat(): m for m in manifests}
    problems = []
    last = saved.get("last_night")
    if last is not None and last not in committed:
        problems.append(f"state.json last_night {last} has no manifest (ahead of committed data)")
    for night in saved.get("committed") or []:
        if night not in committed:
            problems.append(f"state.json lists {night} as committed, but it has no manifest")
    watermark = saved.get("watermark")
    marks = [m.watermark for m in manifests if m.watermark]
    if watermark is not None and (not marks or watermark > max(marks)):
        problems.append(f"state.json watermark {watermark} is ahead of every manifest's ({marks})")
    return problems


def tree_digest(
    root: Path, *, include: tuple[str, ...] = ("",), exclude: tuple[str, ...] = ()
) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``root`` whose path starts with one of
    ``include`` and none of ``exclude``."""
    out = {}
    for path in sorted(root.rglob("*")) if root.exists() else ():
        if not path.is_file():
            continue
        rel = str(path.relative_to(root))
        if rel.startswith(include) and not (exclude and rel.startswith(exclude)):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def published_digest(data_dir: DataDir) -> dict[str, str]:
    """What readers see of the committed nights: manifests, published Parquet, warehouse, CSVs."""
    return tree_digest(
        data_dir.root,
        include=("landing/", "warehouse.duckdb", "reports/"),
        exclude=("landing/_staging/",),
    )


def reports_digest(data_dir: DataDir, night: dt.date) -> str:
    folder = data_dir.reports / night.isoformat()
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.csv")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def manifest_stats(data_dir: DataDir, night: dt.date) -> dict[str, Any]:
    path = data_dir.manifests / f"{night.isoformat()}.json"
    return json.loads(path.read_text(encoding="utf-8")).get("stats") or {}  # type: ignore[no-any-return]


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    box: list[float] = []
    started = time.monotonic()
    try:
        yield box
    finally:
        box.append(time.monotonic() - started)


# --- measured results (for the README's Reliability table) ---------------------------------------

RESULTS_ENV = "MEMBERSYNC_RELIABILITY_RESULTS"


def record(scenario: str, result: str, **figures: Any) -> None:
    """Note a scenario's measured result: printed (``pytest -s``) and, when
    ``MEMBERSYNC_RELIABILITY_RESULTS`` names a file, appended to it as one JSON line."""
    line = json.dumps({"scenario": scenario, "result": result, "figures": figures}, default=str)
    print(f"\n[reliability] {scenario}: {result}")
    target = os.environ.get(RESULTS_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


# --- shared by the scenarios (tests/scenarios/test_reliability*.py) ---------------------------------------

# 4 by default: each kind of cycle once. Moments are drawn before the killed run's commit for
# kills 0, 1 (4, 5, ...) and after it for 2, 3 (6, 7, ...); even kills stop a rerun of a committed
# night, odd ones the first night of a fresh data dir. More (MEMBERSYNC_RELIABILITY_KILLS=8, as in
# docs/reliability.md) draw more moments of the same four kinds; each cycle is ~40 s of the suite.
ANCHOR = TONIGHT  # the night every scenario syncs
KILLS = int(os.environ.get("MEMBERSYNC_RELIABILITY_KILLS", "4"))
# Kills run the CLI without Prefect by default (landing, commit and build are the same code; Prefect
# only wraps the steps in task runs and costs ~10-40 s of start-up per run). "on": exec'd CLI on
# the local Prefect server it serves from a thread.
KILL_WITH_PREFECT = os.environ.get("MEMBERSYNC_RELIABILITY_PREFECT", "off") == "on"


def assert_ok(outcome: Outcome) -> None:
    assert outcome.ok, outcome.describe()


def assert_clean(ws: Workspace) -> None:
    problems = inspect(ws.data_dir).problems()
    assert problems == [], problems


def one_line_error(outcome: Outcome) -> str:
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr:\n{outcome.describe()}"
    return lines[0]


def touch_sandbox(sandbox: RunningSandbox, n: int, salt: int) -> None:
    """A few changes straight on the service (points and a ledger payment), so a night has work."""

    def change(service: Any) -> None:
        clients = list(service.iter_clients())
        rng = random.Random(salt)
        for client in rng.sample(clients, n):
            store = client.home_store
            service.insert_points(
                {"clientNumber": client.client_number, "storecode": store, "points": 5, "reason": "touch"}
            )
            if client.ledger.get(store, 0) > 1:
                service.post_account_ledger_payment(
                    {
                        "clientNumber": client.client_number,
                        "storecode": store,
                        "amount": "0.99",
                        "paymentType": service.store_payment_types[store][0].code,
                    }
                )

    sandbox.call(change)
