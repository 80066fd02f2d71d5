"""Issue 5, scenarios 2 and 3: SIGKILL at random moments, and a crash at every named point.

The two longest reliability scenarios, in a file of their own so that the test runner can give them
a worker of their own (tests/conftest.py runs the longest files first). Helpers and ground truth as
in tests/scenarios/test_reliability.py: real ``membersync sync`` processes, the sandbox's own state.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import truth
from membersync.extract.sandbox.running import RunningSandbox
from membersync.warehouse.landing.crashpoints import POINTS
from membersync.warehouse.landing.manifest import manifest_path
from reliability import (
    ANCHOR,
    KILL_WITH_PREFECT,
    KILLS,
    Outcome,
    Workspace,
    assert_clean,
    assert_ok,
    inspect,
    published_digest,
    record,
    reports_digest,
    state_problems,
    touch_sandbox,
)

# --- 2. SIGKILL at random moments -----------------------------------------------------------------------


def _sync_noting_its_commit(ws: Workspace, how: str) -> tuple[Outcome, float, float]:
    """A sync of ``ws``'s night: its outcome, and when (s after it was started) its manifest
    appeared, i.e. the night was committed, and when it ended."""
    manifest = manifest_path(ws.data_dir.manifests, ANCHOR)
    assert not manifest.exists()
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not seen:
            if manifest.exists():
                seen.append(time.monotonic())
            time.sleep(0.005)

    running = ws.start(how=how)
    started = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outcome = running.wait(600)
    ended = time.monotonic()
    done.set()
    watcher.join()
    assert seen, "the night's manifest never appeared"
    return outcome, seen[0] - started, ended - started


@pytest.mark.slow
def test_sigkill_at_random_moments_then_rerun(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=50, seed=2)
    how = "exec" if KILL_WITH_PREFECT else "fork"
    extra = {"MEMBERSYNC_PREFECT": "on"} if KILL_WITH_PREFECT else {}
    kept = Workspace(tmp_root / "kept", sandbox.url, ANCHOR, batch_size=10, extra_env=extra)
    kept.sync(how=how)  # (the first sync of a process may start the zygote: not a night's timeline)
    truth.assert_night_exact(sandbox, kept.data_dir, ANCHOR)
    digest = reports_digest(kept.data_dir, ANCHOR)
    # A night's timeline: fetching and landing end at the commit, then the warehouse is built.
    # With moments drawn over the whole run, 8 of 8 kills landed after the commit (the fetch of
    # 50 clients is ~0.7 s of a ~6 s run): half of the kills are drawn before it, half after.
    timed = Workspace(tmp_root / "timed", sandbox.url, ANCHOR, batch_size=10, extra_env=extra)
    reference, commit_time, full_time = _sync_noting_its_commit(timed, how)
    assert_ok(reference)
    rng = random.Random(20261121)
    tally = {"exact": 0, "duplicates": 0, "unreadable": 0, "temp_left": 0, "exact_after_kill": 0}
    hit = {"before commit": 0, "after commit": 0}
    started = time.monotonic()
    for i in range(KILLS):
        # Even cycles: a rerun of a committed night is killed (readers must still see that night);
        # odd cycles: the very first night of a fresh data dir is killed.
        ws = (
            kept
            if i % 2 == 0
            else Workspace(tmp_root / f"fresh{i}", sandbox.url, ANCHOR, batch_size=10, extra_env=extra)
        )
        before = manifest_path(ws.data_dir.manifests, ANCHOR)
        run_id = json.loads(before.read_text())["run_id"] if before.exists() else None
        if (i // 2) % 2 == 0:  # kills 0, 1, 4, 5, ...: while fetching and landing
            moment = rng.uniform(0.05, 0.8) * commit_time
        else:
            moment = commit_time + rng.uniform(0.05, 1.0) * (full_time - commit_time)
        running = ws.start(how=how)
        time.sleep(moment)
        running.kill_group()
        killed = running.wait(60)
        after_kill = inspect(ws.data_dir)
        tally["unreadable"] += len(after_kill.unreadable)
        tally["duplicates"] += after_kill.duplicate_keys
        assert after_kill.missing == [] and after_kill.state_problems == [], after_kill.problems()
        now_id = json.loads(before.read_text())["run_id"] if before.exists() else None
        hit["after commit" if now_id not in (None, run_id) else "before commit"] += 1
        if ws is kept:  # readers still see a whole night: the old one or the new one
            truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
            tally["exact_after_kill"] += 1
        rerun = ws.sync(how=how)
        assert_ok(rerun)
        truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
        health = inspect(ws.data_dir)
        tally["duplicates"] += health.duplicate_keys
        tally["unreadable"] += len(health.unreadable)
        tally["temp_left"] += len(health.temp_files) + len(health.staging_files) + len(health.orphans)
        assert health.problems() == [], (i, moment, killed.status, health.problems())
        assert reports_digest(ws.data_dir, ANCHOR) == digest, "a rerun changed the CSV bytes"
        tally["exact"] += 1
    elapsed = time.monotonic() - started
    record(
        "2 SIGKILL anywhere",
        f"{KILLS} kills{' (Prefect on)' if KILL_WITH_PREFECT else ''} (seeded, "
        f"{hit['before commit']} before / {hit['after commit']} after the "
        f"killed run's commit): {tally['exact']}/{KILLS} reruns exact and byte-identical, "
        f"{tally['duplicates']} duplicate keys, {tally['unreadable']} unreadable files, "
        f"{tally['temp_left']} temporary files left; readers saw a whole night after "
        f"{tally['exact_after_kill']}/{(KILLS + 1) // 2} kills of a rerun",
        seconds=round(elapsed, 1),
        full_run_s=round(full_time, 1),
        commit_s=round(commit_time, 1),
    )
    if KILLS >= 4:  # the commit's moment varies from run to run: each side hit at least once
        assert hit["before commit"] >= 1 and hit["after commit"] >= 1, hit


# --- 3. crash at named points ------------------------------------------------------------------------


@pytest.mark.slow
def test_crash_at_every_named_point_recovers(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=60, seed=3)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR, batch_size=15)
    results: dict[str, str] = {}
    previous: dict[str, str] = {}
    last: tuple[dt.date, truth.Reports] | None = None
    for k, point in enumerate(POINTS):
        night = ANCHOR - dt.timedelta(days=len(POINTS) - 1 - k)  # one night per point, up to today
        if k:
            touch_sandbox(sandbox, 5, salt=k)
        try:
            results[point] = _crash_and_recover(sandbox, ws, point, night, previous, last)
            last = (night, truth.truth_of(sandbox, night))
        except AssertionError as exc:
            results[point] = "FAILED: " + str(exc).splitlines()[0][:200]
            assert_ok(ws.sync(ws.argv(night)))  # leave a committed night for the next point
            last = (night, truth.assert_night_exact(sandbox, ws.data_dir, night))
        previous = published_digest(ws.data_dir)
    ok = sum(not r.startswith("FAILED") for r in results.values())
    record(
        "3 crash at named points",
        f"{ok}/{len(POINTS)} recover exact, state never ahead of the manifests: "
        + "; ".join(f"{p}: {r}" for p, r in results.items()),
    )
    assert ok == len(POINTS), results


def _crash_and_recover(
    sandbox: RunningSandbox,
    ws: Workspace,
    point: str,
    night: dt.date,
    previous: dict[str, str],
    last: tuple[dt.date, truth.Reports] | None,
) -> str:
    # the 2nd batch of the first night (so the rerun resumes), the first time everywhere else
    where = f"{point}:2" if point == "after_batch_landed" else point
    crashed = ws.sync(ws.argv(night), env=ws.env(MEMBERSYNC_CRASH_AT=where))
    assert crashed.status == -9, f"crash point {point} was not reached (exit {crashed.status})"
    health = inspect(ws.data_dir)
    assert health.unreadable == [] and health.missing == [] and health.duplicate_keys == 0, health
    assert state_problems(ws.data_dir) == [], state_problems(ws.data_dir)
    # committed nights before this one are untouched, and readers still see the last whole night
    now = published_digest(ws.data_dir)
    changed = sorted(p for p in previous if previous[p] != now.get(p) and _night_of(p) != night)
    assert changed == [], f"a crash changed published files of earlier nights: {changed[:5]}"
    if last is not None:
        problems = truth.report_differences(truth.warehouse_reports(ws.data_dir, last[0]), last[1])
        problems += truth.csv_differences(ws.data_dir, last[0], last[1])
        assert problems == [], problems[:5]
    rerun = ws.sync(ws.argv(night))
    assert_ok(rerun)
    truth.assert_night_exact(sandbox, ws.data_dir, night)
    assert_clean(ws)
    reused = rerun.summary_value("batches") or ""
    return "exact" + (f" ({reused.split(' (')[-1].rstrip(')')})" if "reused" in reused else "")


def _night_of(relative: str) -> dt.date | None:
    for part in relative.replace(".json", "").split("/"):
        with contextlib.suppress(ValueError):
            return dt.date.fromisoformat(part.removeprefix("snapshot_date="))
    return None
