"""Issue 62: one writer per data location on S3 — the lease in the bucket and its fence.

Real parts: moto's S3 server on 127.0.0.1 with versioning on, the sandbox on loopback, real
``membersync`` processes with working dirs of their own (as machines), frozen with SIGSTOP and
killed with SIGKILL. What the tests compare is the bucket itself: every version of every object.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import truth
from conftest import BUCKET, s3_prefix
from membersync.extract.sandbox.running import RunningSandbox
from membersync.warehouse.landing.lease import LEASE, LEASE_LOG, PENDING, Lease
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.storage import LeaseLost, ObjectStore, hold_fence, s3_filesystem
from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone
from nights import TONIGHT as NIGHT
from reliability import Running, Workspace

LEASE_SECONDS = 3.0


def versioned_location(name: str) -> str:
    fs = s3_filesystem()
    fs.call_s3("put_bucket_versioning", Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return s3_prefix(name)


def machine(root: Path, sandbox: RunningSandbox, location: str, aws: dict[str, str]) -> Workspace:
    env = {
        **aws,
        "MEMBERSYNC_DATA_DIR": location,
        "MEMBERSYNC_CACHE_DIR": str(root / "work"),
        "MEMBERSYNC_LEASE_SECONDS": str(LEASE_SECONDS),
        "MEMBERSYNC_ERASURE_KEY_FILE": str(root.parent / "erasure.key"),
    }
    return Workspace(root, sandbox.url, NIGHT, batch_size=10, extra_env=env)


def every_version(location: str) -> set[tuple[str, str, str]]:
    """(key, version id, ETag) of every object version and delete marker under ``location``."""
    fs = s3_filesystem()
    prefix = location.removeprefix(f"s3://{BUCKET}/") + "/"
    found: set[tuple[str, str, str]] = set()
    kwargs = {"Bucket": BUCKET, "Prefix": prefix}
    while True:
        page = fs.call_s3("list_object_versions", **kwargs)
        for item in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
            found.add((item["Key"].removeprefix(prefix), item["VersionId"], item.get("ETag", "marker")))
        if not page.get("IsTruncated"):
            return found
        kwargs = {**kwargs, "KeyMarker": page["NextKeyMarker"]}
        kwargs["VersionIdMarker"] = page["NextVersionIdMarker"]


def lease_doc(location: str) -> dict[str, object] | None:
    fs = s3_filesystem()
    key = f"{location.removeprefix('s3://')}/{LEASE}"
    return json.loads(fs.cat_file(key)) if fs.exists(key) else None


def wait_until_held_by(location: str, run: Running, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = lease_doc(location)
        if doc and not doc["released"] and doc["holder"]["pid"] == str(run.pid):  # type: ignore[index]
            return doc
        assert run.poll() is None, "the writer ended before it held the lease"
        time.sleep(0.05)
    raise AssertionError("the writer never held the lease")


def lease_log(location: str) -> list[dict[str, object]]:
    fs = s3_filesystem()
    folder = f"{location.removeprefix('s3://')}/{LEASE_LOG}"
    return [json.loads(fs.cat_file(name)) for name in sorted(fs.ls(folder, detail=False))]


# --- a writer frozen past its lease ----------------------------------------------------------------------


def test_a_writer_frozen_past_its_lease_is_refused_by_its_fencing_token_and_changes_nothing(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_root: Path, aws_env: dict[str, str]
) -> None:
    """Machine A's night is frozen (SIGSTOP) while it lands, past its lease; machine B takes the
    lease over and commits the night; A is let go (SIGCONT): its commit is refused by the fence
    with one line, and not one version of one object in the bucket is new or gone because of it."""
    sandbox = fresh_sandbox(clients=120, seed=7, anchor_date=NIGHT, latency_ms=15.0)
    location = versioned_location("frozen")
    a = machine(tmp_root / "a", sandbox, location, aws_env)
    b = machine(tmp_root / "b", sandbox, location, aws_env)
    frozen = a.start()
    held = wait_until_held_by(location, frozen)
    frozen.kill_group(signal.SIGSTOP)
    try:
        time.sleep(LEASE_SECONDS + 1.5)  # its lease has expired: nobody renewed it
        took_over = b.sync([*b.argv(), "--wait"])
        assert took_over.ok, took_over.describe()
        before = every_version(location)
    finally:
        frozen.kill_group(signal.SIGCONT)
    refused = frozen.wait(300)
    assert refused.status == 1, refused.describe()
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, refused.stderr
    assert f"(token {held['token']}) was taken over" in lines[0] and "refused" in lines[0], lines[0]
    assert every_version(location) == before, "the refused writer changed the bucket"
    log = lease_log(location)
    assert [e["token"] for e in log] == list(range(1, len(log) + 1))
    assert log[1]["took_over_from"]["token"] == held["token"]  # type: ignore[index]
    other = DataDir.remote_location(location, str(tmp_root / "analyst"))
    assert b.sync(["reports"], env=b.env(MEMBERSYNC_CACHE_DIR=str(other.root))).ok
    truth.assert_night_exact(sandbox, other, NIGHT)


def test_a_killed_writers_lease_names_it_then_ends_by_itself(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_root: Path, aws_env: dict[str, str]
) -> None:
    """A SIGKILLed night's lease: the next writer without ``--wait`` is one line naming the holder
    (exit 1); with ``--wait`` it runs once the lease has expired, within its documented time."""
    sandbox = fresh_sandbox(clients=60, seed=3, anchor_date=NIGHT, latency_ms=10.0)
    location = versioned_location("killed")
    a = machine(tmp_root / "a", sandbox, location, aws_env)
    b = machine(tmp_root / "b", sandbox, location, aws_env)
    run = a.start()
    wait_until_held_by(location, run)
    run.kill_group(signal.SIGKILL)
    run.wait(60)
    killed_at = time.monotonic()
    refused = b.sync()
    assert refused.status == 1, refused.describe()
    (line,) = [x for x in refused.stderr.splitlines() if x.strip()]
    assert f"another writer holds {location}: `" in line and f"pid {run.pid}" in line, line
    waited = b.sync([*b.argv(), "--wait"])
    assert waited.ok, waited.describe()
    assert time.monotonic() - killed_at >= LEASE_SECONDS - 1.0  # it did wait for the lease to end
    other = DataDir.remote_location(location, str(tmp_root / "analyst"))
    assert b.sync(["reports"], env=b.env(MEMBERSYNC_CACHE_DIR=str(other.root))).ok
    truth.assert_night_exact(sandbox, other, NIGHT)


# --- the fence's intents, finished by the next holder ------------------------------------------------------


def _store(location: str, name: str) -> ObjectStore:
    return ObjectStore(DataDir.remote_location(location, tempfile.mkdtemp(prefix=f"{name}-")))


def test_a_write_the_fence_accepted_is_finished_by_the_next_holder_and_a_late_copy_fails(
    aws_env: dict[str, str],
) -> None:
    """A holder passes the fence for a write and stops before making it (its lease expires); the
    next holder makes it when it takes over and erases the staged copy, so the first holder's
    late copy has nothing to copy; a write after the takeover is refused."""
    location = versioned_location("intents")
    first_store, second_store = _store(location, "a"), _store(location, "b")
    first = Lease(first_store, location, LEASE_SECONDS)
    first.acquire()
    hold_fence(first_store.data_dir, first)
    first._stop.set()
    pending = f"{first.pending_prefix()}/state/doc.json"
    first_store.put(pending, b"accepted")
    with first.fenced("a write", [{"copy": [pending, "state/doc.json"]}]):
        pass  # ... and the process stops here, before the copy
    time.sleep(LEASE_SECONDS + 0.5)
    second = Lease(second_store, location, LEASE_SECONDS)
    second.acquire()
    try:
        assert second_store.get("state/doc.json")[0] == b"accepted"
        assert second.token == first.token + 1
        assert first_store.copy_and_erase(pending, "state/doc.json") is None  # the late copy
        assert not second_store.listing(PENDING)
        with pytest.raises(LeaseLost, match=r"parts: refused, the lease of .* \(token 1\) was taken over"):
            first_store.hold("parts")  # the check before writes that need no intents
        with pytest.raises(LeaseLost, match=r"refused, the lease of .* \(token 1\) was taken over"):
            first_store.write_doc("state/other.json", b"late", None)
        assert second_store.get("state/other.json")[0] is None
    finally:
        hold_fence(first_store.data_dir, None)
        second.release()


def test_a_write_without_the_lease_is_refused(aws_env: dict[str, str]) -> None:
    """Fail closed: a store of a bucket written by a process that holds no lease writes nothing."""
    location = versioned_location("nolease")
    store = _store(location, "a")
    with pytest.raises(LeaseLost, match="does not hold the lease"):
        store.write_doc("privacy/register.json", b"{}", None)
    assert every_version(location) == set()


def test_wait_takes_the_lease_when_its_holder_releases_it(aws_env: dict[str, str], tmp_root: Path) -> None:
    """``--wait`` polls a held lease and takes it at its release, with the next token."""
    location = versioned_location("wait")
    zones = [LandingZone(DataDir.remote_location(location, str(tmp_root / n))) for n in "ab"]
    took: list[float] = []

    def waiter() -> None:
        with zones[1].lock(wait=True):
            took.append(time.monotonic())

    with zones[0].lock():
        with pytest.raises(AlreadyRunning, match="--wait waits for it"), zones[1].lock():
            pass
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(1.5)
        assert not took, "it took a held lease"
        released = time.monotonic()
    thread.join(30)
    assert took and took[0] >= released
    assert [e["token"] for e in lease_log(location)] == [1, 2]  # the refused try took no token


def test_the_check_before_parts_reads_the_lease_and_refuses_a_holder_taken_over(
    aws_env: dict[str, str],
) -> None:
    """``hold`` (before a night's parts, before each Delta commit) is one read of the lease's ETag
    while renewals are on time: a machine whose clock runs 100 s ahead takes the lease over
    early, and the first holder, its own renewal not yet due, is refused by that read alone."""
    location = versioned_location("verify")
    first_store, second_store = _store(location, "a"), _store(location, "b")
    first = Lease(first_store, location, 30.0)
    first.acquire()
    hold_fence(first_store.data_dir, first)
    try:
        first_store.hold("parts")  # still ours: passes, with no write
        assert first.fences == 0
        second = Lease(second_store, location, 30.0, clock=lambda: time.time() + 100)
        second.acquire()
        with pytest.raises(LeaseLost, match=r"parts: refused, .* \(token 1\) was taken over .* \(token 2\)"):
            first_store.hold("parts")
        second.release()
    finally:
        hold_fence(first_store.data_dir, None)
        first.release()
