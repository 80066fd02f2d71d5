"""Issue 62: four machines on one versioned bucket, in random overlapping order.

Each round starts, on four working dirs of their own (as four machines), a random overlapping mix
of ``sync``, ``forget``, ``retention``, ``reports`` and a sync SIGKILLed once it holds the lease;
some wait for the lease (``--wait``), some are told who holds it (exit 1). After each round:

- **one writer at a time**: the lease's own log (tokens one after another, each acquired after its
  predecessor released or expired), and every fenced write each machine logged carries the token
  that held the lease at that instant;
- **every report equals the truth** (a fifth machine's ``reports``, from the sandbox's own state,
  the forgotten clients on their keys);
- **a forgotten client is in no object of any version** of the bucket (the control still is);
- **no committed night was lost**.

``MEMBERSYNC_CHAOS_ROUNDS`` sets the rounds (default 2 in the suite; the issue asks 20, run by hand).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import truth
from canaries import add_canaries
from conftest import BUCKET
from membersync.extract.sandbox.running import RunningSandbox
from membersync.warehouse.landing.identity import client_hmac
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.storage import ObjectStore
from nights import LAST_NIGHT, TONIGHT
from privacy_scan import Canary, s3_client, scan_bucket
from reliability import Running, Workspace
from test_lease import lease_log, machine, versioned_location, wait_until_held_by

ROUNDS = int(os.environ.get("MEMBERSYNC_CHAOS_ROUNDS", "2"))  # read by this test only
COMMANDS = ("sync", "sync", "reports", "retention", "forget", "kill")
FENCED = re.compile(r"^(\S+ \S+) INFO .*fenced write, lease token (\d+): (.*)$")


def _start(ws: Workspace, command: str, rng: random.Random, canary: Canary | None) -> Running:
    wait = ["--wait"] if rng.random() < 0.7 else []
    argv = {
        "sync": [*ws.argv(TONIGHT), *wait],
        "kill": [*ws.argv(TONIGHT), "--wait"],
        "reports": ["reports", *wait],
        "retention": ["retention", *wait],
        "forget": ["forget", canary.number if canary else "0", "--reason", "chaos", *wait],
    }[command]
    return ws.start(argv)


def _round(
    machines: list[Workspace], location: str, rng: random.Random, to_forget: list[Canary], *, kill: bool
) -> list[str]:
    """One round: 2-4 commands on random machines, started at random instants (the first a
    killed sync when ``kill``); returns what ran and how it ended."""
    runs: list[tuple[str, Running]] = []
    for order, ws in enumerate(rng.sample(machines, rng.randint(2, len(machines)))):
        command = "kill" if kill and order == 0 else rng.choice(COMMANDS)
        canary = to_forget.pop(0) if command == "forget" and to_forget else None
        if command == "forget" and canary is None:
            command = "reports"
        run = _start(ws, command, rng, canary)
        runs.append((command if canary is None else f"forget {canary.number}", run))
        if command == "kill":
            wait_until_held_by(location, run, timeout=120)
            run.kill_group(signal.SIGKILL)
        time.sleep(rng.uniform(0.0, 1.5))
    said = []
    for command, run in runs:
        outcome = run.wait(600)
        said.append(f"{command}: {outcome.status}")
        if command.startswith("forget") and outcome.status != 0:
            to_forget.append(next(c for c in ALL if c.number == command.split()[1]))  # try it again
        assert outcome.status in (0, 1, -9), outcome.describe()
        if outcome.status == 1:  # refused, in one line: it names the holder, or its lease was lost
            # one line, the command's log warnings aside (the build's "counted as other", the
            # renewal that found the lease taken over: a command with no log file shows them)
            lines = [x for x in outcome.stderr.splitlines() if x.strip() and not x.startswith("WARNING:")]
            assert len(lines) == 1, outcome.describe()
            assert "another writer holds" in lines[0] or "was taken over" in lines[0], outcome.describe()
    return said


ALL: list[Canary] = []


def _check_one_writer(location: str, machines: list[Workspace]) -> None:
    """Tokens in order, each acquired once the previous was released or had expired; every fenced
    write logged on any machine under the token holding the lease at that second."""
    log = lease_log(location)
    assert [e["token"] for e in log] == list(range(1, len(log) + 1))
    for before, after in itertools.pairwise(log):
        if "released_at" in before:
            assert after["acquired_at"] >= before["released_at"], (before, after)
        else:  # its holder died: taken over only from it, once it expired
            assert after["took_over_from"]["token"] == before["token"], (before, after)  # type: ignore[index]
    starts = [(e["acquired_at"], e["token"]) for e in log]
    for ws in machines:
        for path in (ws.root / "work" / "logs").glob("*.log"):
            for line in path.read_text(errors="replace").splitlines():
                found = FENCED.match(line)
                if not found:
                    continue
                at = dt.datetime.strptime(found.group(1)[:19], "%Y-%m-%d %H:%M:%S").astimezone(dt.UTC)
                stamp = f"{at:%Y-%m-%dT%H:%M:%SZ}"
                held = [t for s, t in starts if s <= stamp]
                assert held and int(found.group(2)) in held[-2:], (line, held[-3:])


def _register_keys(machines: list[Workspace], location: str) -> dict[str, str]:
    """Canary number -> key of every canary the erasure register names (none: no register yet).

    A forget that exited 1 (its lease taken over) may have registered its erasure before: the
    next command's upkeep finishes it, so the register, not the exit code, says who is forgotten."""
    key_file = Path(machines[0].env()["MEMBERSYNC_ERASURE_KEY_FILE"])
    name = f"{location.removeprefix(f's3://{BUCKET}/')}/privacy/erasures.json"
    try:
        body = s3_client().get_object(Bucket=BUCKET, Key=name)["Body"].read()
    except s3_client().exceptions.NoSuchKey:
        return {}
    key = bytes.fromhex(key_file.read_text().strip())
    by_hmac = {c["hmac"]: c["key"] for e in json.loads(body)["erasures"] for c in e["clients"]}
    return {
        c.number: by_hmac[client_hmac(key, c.number)] for c in ALL if client_hmac(key, c.number) in by_hmac
    }


def test_four_machines_in_random_overlapping_order_keep_every_promise(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_root: Path, aws_env: dict[str, str]
) -> None:
    sandbox = fresh_sandbox(clients=40, stores=2, seed=29, anchor_date=TONIGHT, latency_ms=2.0)
    canaries = add_canaries(sandbox)
    ALL[:] = list(canaries.values())
    location = versioned_location("chaos")
    machines = [machine(tmp_root / f"m{i}", sandbox, location, aws_env) for i in range(4)]
    for ws in machines:
        ws.extra_env["MEMBERSYNC_RETENTION"] = "daily=400d"  # retention runs, and keeps both nights
        # 3 s (test_lease.py) lapses on this loaded 2-core machine; a lapsed lease fails closed
        ws.extra_env["MEMBERSYNC_LEASE_SECONDS"] = "8"
    for night in (LAST_NIGHT, TONIGHT):
        assert machines[0].sync(machines[0].argv(night)).ok
    to_forget = [canaries["alpha"], canaries["beta"]]
    committed = _committed(DataDir.remote_location(location, str(tmp_root / "probe")))
    rng = random.Random(62)
    history: list[list[str]] = []
    for index in range(ROUNDS):
        history.append(_round(machines, location, rng, to_forget, kill=index == 0))
        _check_one_writer(location, machines)
        analyst = DataDir.remote_location(location, str(tmp_root / "analyst"))  # builds what changed
        committed = _check_round(sandbox, machines, analyst, canaries["control"], committed, history)
    assert any(s.startswith("kill") for r in history for s in r), history


def _committed(data_dir: DataDir) -> set[dt.date]:
    return {m.snapshot_date for m in ObjectStore(data_dir).manifests()}


def _check_round(
    sandbox: RunningSandbox,
    machines: list[Workspace],
    analyst: DataDir,
    control: Canary,
    committed: set[dt.date],
    history: list[list[str]],
) -> set[dt.date]:
    """The reports of a fresh machine equal the truth, no version of any object names a forgotten
    client (the control is found), every night committed before still is; returns the nights."""
    context = f"round {len(history) - 1}: {history[-1]}"
    location = str(analyst.remote)
    env = machines[0].env(MEMBERSYNC_CACHE_DIR=str(analyst.root))
    built = machines[0].sync(["reports", "--wait"], env=env)  # its upkeep finishes a pending erasure
    assert built.ok, (context, built.describe())
    keys = _register_keys(machines, location)
    assert {c.number for c in _forgotten(history)} <= set(keys), context  # every forget that said done
    forgotten = [c for c in ALL if c.number in keys]
    truth.assert_night_exact(sandbox, analyst, TONIGHT, forgotten=keys)
    hits = scan_bucket(BUCKET, [*forgotten, control], location.removeprefix(f"s3://{BUCKET}/"))
    assert all(hits[c.number] == [] for c in forgotten), (context, hits)
    assert hits[control.number], context
    now = _committed(analyst)
    assert committed <= now, (context, committed - now)
    return now


def _forgotten(history: list[list[str]]) -> list[Canary]:
    """The canaries a forget of some round forgot (exit 0)."""
    done = {
        s.split(":")[0].split()[1] for r in history for s in r if s.startswith("forget") and s.endswith(": 0")
    }
    return [c for c in ALL if c.number in done]
