"""One writer per data location: a flock on a local data dir, a lease in the bucket on ``s3://``.

Every command that writes (``sync`` and its shards' parent, ``reports``, ``forget``,
``retention``, ``audit``, migrations) holds the data location's writer lock for as long as it
writes, through one interface, :class:`WriterLock`::

                    WriterLock: acquire(wait) / release() / fenced(what, intents)
                       |                                        |
          a local data dir: FileLock                 s3://bucket/prefix: Lease
          (flock on DATA_DIR/.lock; the kernel       (lease/lease.json, compare-and-swap on its
           ends it when the process dies)             ETag; expires unless renewed)

**The lease** (Chubby's and the DynamoDB lock client's design, with Kleppmann's fencing) is one
small object, ``lease/lease.json``: its holder (machine, pid, command, since), a **fencing
token** that grows by one at every acquisition, and the instant it expires. It is acquired with a
conditional put (``If-None-Match: *`` when absent; ``If-Match: <etag>`` over a released or expired
one), renewed every third of its time (:data:`~membersync.extract.settings.Settings.lease_seconds`)
by a thread, and released at the end. A SIGKILLed holder stops renewing: its lease ends by itself
``MEMBERSYNC_LEASE_SECONDS`` after its last renewal (machines' clocks agreeing within a few seconds,
as NTP keeps them). Each acquisition is also written to the lease's log, ``lease/log/<token>.json``
(holder, token, when acquired and released): the history of who wrote, for people and the tests.

**Fenced writes.** A holder paused past its lease (GC, SIGSTOP, a network partition) must not
write after another took over. S3 checks a condition only on the object written, so every write
of the data location that changes what readers see goes through the lease object itself:

1. the new content is uploaded under ``lease/pending/<token>-<seq>/`` (no reader looks there);
2. the lease is rewritten *conditionally on the ETag this holder last wrote* (the fence), naming
   the writes it is about to make (its **intents**: copy a pending object to its place, delete a
   version of an object); a holder whose lease was taken over fails here, with one line, having
   changed nothing a reader sees;
3. the intents are carried out (server-side copies; deletes of exact version ids), and the
   pending objects erased.

A holder paused between 2 and 3 has had its writes *accepted*: the next holder carries its intents
out when it takes over (:meth:`Lease._roll_forward`), before anything of its own, and erases the
pending objects; the paused holder's late copy then finds no source and fails. So every write a
reader can see was made under the lease at the time, in token order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from membersync.warehouse.landing.storage import LeaseLost, StoreError

log = logging.getLogger(__name__)

LEASE = "lease/lease.json"
LEASE_LOG = "lease/log"
PENDING = "lease/pending"
POLL_SECONDS = 1.0  # how often `--wait` looks at a held lease


class AlreadyRunning(StoreError):
    """Another writer holds the data location's lock or lease; the message names it."""


Intent = dict[str, list[str]]  # {"copy": [pending, dest]} or {"delete": [relative, version_id]}


class WriterLock(Protocol):
    """What every writing command holds: one writer per data location at any instant."""

    token: int

    def acquire(self, wait: bool = False) -> None: ...

    def release(self) -> None: ...

    def fenced(
        self, what: str, intents: Sequence[Intent] = ()
    ) -> contextlib.AbstractContextManager[None]: ...


def holder_description() -> dict[str, str]:
    """Who holds a lock: this machine, process and command, and since when (UTC)."""
    argv = [os.path.basename(sys.argv[0] or "python"), *sys.argv[1:2]]
    return {
        "machine": socket.gethostname(),
        "pid": str(os.getpid()),
        "command": " ".join(argv),
        "since": _stamp(time.time()),
    }


def _stamp(seconds: float) -> str:
    return f"{dt.datetime.fromtimestamp(seconds, dt.UTC):%Y-%m-%dT%H:%M:%SZ}"


def _seconds(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


# --- a local data dir ------------------------------------------------------------------------------


class FileLock:
    """``DATA_DIR/.lock`` (flock): the kernel ends it with the process, and no other machine
    writes a local data dir, so a write needs no fence."""

    token = 0

    def __init__(self, path: os.PathLike[str], where: str, mode: int) -> None:
        self.path, self.where, self.mode = path, where, mode
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.mode)
        try:
            os.fchmod(fd, self.mode)
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise AlreadyRunning(f"another writer is running on {self.where}: {holder}") from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {self.path}: {exc.__class__.__name__}: {exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_description()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @contextlib.contextmanager
    def fenced(self, what: str, intents: Sequence[Intent] = ()) -> Iterator[None]:
        if self._fd is None:
            raise LeaseLost(f"{what} needs the data dir's lock")
        yield


def _read_holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        return describe(json.loads(raw)) if raw.startswith("{") else f"pid {raw or 'unknown'}"
    except (OSError, ValueError):
        return "pid unknown"


def describe(holder: dict[str, Any]) -> str:
    return (
        f"`{holder.get('command', '?')}` on {holder.get('machine', '?')}, pid {holder.get('pid', '?')}, "
        f"since {holder.get('since', '?')}"
    )


# --- a data location in a bucket ---------------------------------------------------------------------


@dataclass
class LeaseDoc:
    """The content of ``lease/lease.json``."""

    token: int
    holder: dict[str, str]
    expires_at: float
    released: bool = False
    seq: int = 0
    intents: list[Intent] = field(default_factory=list)

    def to_json(self) -> bytes:
        body = {
            "format": 1,
            "token": self.token,
            "holder": self.holder,
            "expires_at": _stamp(self.expires_at),
            "released": self.released,
            "seq": self.seq,
            "intents": self.intents,
        }
        return json.dumps(body, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> LeaseDoc:
        try:
            raw = json.loads(data)
            return cls(
                token=int(raw["token"]),
                holder=dict(raw["holder"]),
                expires_at=_seconds(raw["expires_at"]),
                released=bool(raw["released"]),
                seq=int(raw.get("seq", 0)),
                intents=list(raw.get("intents", [])),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{where} is not a lease ({exc}); remove it only if no writer runs") from None


class Lease:
    """The lease of an ``s3://`` data location (see the module's docstring)."""

    def __init__(self, objects: Any, url: str, ttl: float, *, clock: Any = time.time) -> None:
        self.objects = objects  # the ObjectStore's raw operations (get/put/copy/delete of keys)
        self.url = url
        self.ttl = ttl
        self.clock = clock
        self.token = 0
        self.doc: LeaseDoc | None = None
        self._etag: str | None = None
        self._lost: str | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._waited = 0.0
        self._open: list[Intent] = []  # the intents of the fenced write under way, if any
        # seconds the command's own thread spent in the lease's requests and the fence's copies:
        # what the lease adds to its wall time (renewals run beside it; a publication's parallel
        # checks are inside the publication's own time)
        self.spent = 0.0
        self._owner: int | None = None
        self.fences = 0

    # -- acquiring and releasing ------------------------------------------------------------------

    def acquire(self, wait: bool = False) -> None:
        """Take the lease, or raise :class:`AlreadyRunning` naming its holder (``wait``: poll
        until it is released or expires)."""
        started = time.perf_counter()
        self._owner = threading.get_ident()
        self._acquire(wait)
        self._count(time.perf_counter() - started - self._waited)

    def _acquire(self, wait: bool) -> None:
        self._waited = 0.0
        while True:
            data, etag = self.objects.get(LEASE)
            previous = LeaseDoc.from_json(data, f"{self.url}/{LEASE}") if data is not None else None
            if previous is not None and not previous.released and previous.expires_at > self.clock():
                if not wait:
                    raise AlreadyRunning(
                        f"another writer holds {self.url}: {describe(previous.holder)} (lease token "
                        f"{previous.token}, until {_stamp(previous.expires_at)} unless renewed); "
                        "--wait waits for it"
                    )
                time.sleep(POLL_SECONDS)
                self._waited += POLL_SECONDS
                continue
            if self._take(previous, etag):
                break
        self._roll_forward()
        swept = self.objects.sweep(PENDING)  # what writers refused by the fence left staged
        if swept:
            log.info("lease of %s: %d object(s) a refused writer staged erased", self.url, swept)
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._renewer.start()

    def _take(self, previous: LeaseDoc | None, etag: str | None) -> bool:
        token = previous.token + 1 if previous else 1
        carried = previous.intents if previous and not previous.released else []
        doc = LeaseDoc(token, holder_description(), self.clock() + self.ttl, intents=list(carried))
        new_etag = self.objects.put_if(LEASE, doc.to_json(), etag)
        if new_etag is None:
            return False  # another machine took it between our read and our put
        self.doc, self._etag, self.token, self._lost = doc, new_etag, token, None
        entry = {"token": token, "holder": doc.holder, "acquired_at": doc.holder["since"]}
        if previous is not None and not previous.released:
            entry["took_over_from"] = {"token": previous.token, "holder": previous.holder}
        self.objects.put(f"{LEASE_LOG}/{token:012d}.json", json.dumps(entry, indent=1).encode())
        log.info("lease of %s taken (token %d)", self.url, token)
        return True

    def release(self) -> None:
        """End the lease (the next writer need not wait for it to expire); what this holder
        had under way stays named in it, for the next holder to finish."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        started = time.perf_counter()
        self._release()
        self._purge_versions()  # a versioned bucket keeps no renewal of a released lease
        self._count(time.perf_counter() - started)
        log.info(
            "lease of %s (token %d): %d fenced write(s), %.2f s in its requests and the fence's copies",
            self.url,
            self.token,
            self.fences,
            self.spent,
        )

    def _release(self) -> None:
        with self._mutex:
            if self.doc is None or self._lost:
                return
            done = LeaseDoc(
                self.token, self.doc.holder, self.clock(), True, self.doc.seq + 1, self.doc.intents
            )
            released = self.objects.put_if(LEASE, done.to_json(), self._etag)
            if released is None:
                log.warning("lease of %s: taken over before it was released", self.url)
            self._etag = released
            key = f"{LEASE_LOG}/{self.token:012d}.json"
            data, _ = self.objects.get(key)
            entry = json.loads(data) if data else {"token": self.token}
            entry["released_at"] = _stamp(self.clock())
            self.objects.put(key, json.dumps(entry, indent=1).encode())
            self.doc = None

    # -- renewal and the fence --------------------------------------------------------------------

    def _renew_loop(self) -> None:
        purged = self.clock()
        while not self._stop.wait(self._until_renewal()):
            try:
                self._swap(self._open, "renewing the lease")
            except LeaseLost:
                log.warning("lease of %s lost: %s", self.url, self._lost)
                return
            except Exception as exc:  # a network error: try again soon, until expiry
                log.warning("lease of %s not renewed (%s); trying again", self.url, exc.__class__.__name__)
                continue
            if self.clock() - purged >= self.ttl:
                purged = self.clock()
                self._purge_versions()

    def _until_renewal(self) -> float:
        """Seconds until a third of the lease has passed since it was last written (by a renewal
        or a fence): a renewal on a deadline, so a slow request does not push the next one late."""
        with self._mutex:
            doc = self.doc
        if doc is None:
            return self.ttl / 3
        return min(self.ttl / 3, max(doc.expires_at - self.ttl * 2 / 3 - self.clock(), 0.05))

    def _purge_versions(self) -> None:
        """The lease's older versions dropped (a versioned bucket keeps every renewal), beside
        the renewals and outside the fence's lock: a listing of versions can be slow."""
        etag = self._etag
        if etag is None:
            return
        try:
            self.objects.drop_older_versions(LEASE, etag)
        except Exception as exc:  # only a cost: the next purge takes them
            log.warning("lease of %s: older versions not dropped (%s)", self.url, exc.__class__.__name__)

    def charge(self, seconds: float) -> None:
        """Count time a fenced write spent beyond the write itself (its staging, its copies)."""
        self._count(seconds)

    def _count(self, seconds: float) -> None:
        if threading.get_ident() == self._owner:
            self.spent += seconds

    def _swap(self, intents: list[Intent], what: str) -> None:
        """Rewrite the lease conditionally on the ETag this holder last wrote (the fence)."""
        started = time.perf_counter()
        try:
            self._swap_now(intents, what)
        finally:
            self._count(time.perf_counter() - started)

    def _swap_now(self, intents: list[Intent], what: str) -> None:
        with self._mutex:
            if self._lost:
                raise LeaseLost(f"{what}: refused, {self._lost}")
            if self.doc is None:
                raise LeaseLost(f"{what}: refused, {self.url}'s lease is not held by this process")
            doc = LeaseDoc(
                self.token, self.doc.holder, self.clock() + self.ttl, False, self.doc.seq + 1, intents
            )
            etag = self.objects.put_if(LEASE, doc.to_json(), self._etag)
            if etag is None:
                data, _ = self.objects.get(LEASE)
                now = LeaseDoc.from_json(data, LEASE) if data else None
                self._lost = (
                    f"the lease of {self.url} (token {self.token}) was taken over"
                    + (f" by {describe(now.holder)} (token {now.token})" if now else "")
                    + "; nothing was written"
                )
                raise LeaseLost(f"{what}: refused, {self._lost}")
            self.doc, self._etag = doc, etag

    def verify(self, what: str) -> None:
        """Check, with one read of the lease's ETag, that no one took it over: before writes that
        need no intents (a night's parts, which only its fenced manifest makes visible; a Delta
        commit, delta-rs's own conditional put).
        A renewal overdue (this process was paused: under half its time left) passes the fence
        instead, which renews it."""
        with self._mutex:
            etag, doc, lost = self._etag, self.doc, self._lost
        if lost or doc is None or self.clock() > doc.expires_at - self.ttl / 2:
            self._swap(list(self._open), what)
            return
        started = time.perf_counter()
        now = self.objects.etag(LEASE)
        self._count(time.perf_counter() - started)
        with self._mutex:
            if now in (etag, self._etag):  # ours, or a renewal of ours meanwhile
                return
        self._swap(list(self._open), what)  # the swap names who took it over, and refuses

    @contextlib.contextmanager
    def fenced(self, what: str, intents: Sequence[Intent] = ()) -> Iterator[None]:
        """Pass the fence for ``what`` (naming its ``intents``), then let the caller make them."""
        self._swap(list(intents), what)
        self.fences += 1
        self._open = list(intents)
        log.info("fenced write, lease token %d: %s", self.token, what)
        yield
        self._open = []  # done: the next renewal no longer names them

    def pending_prefix(self) -> str:
        """Where this holder's next fenced write stages its objects."""
        return f"{PENDING}/{self.token}-{(self.doc.seq if self.doc else 0) + 1}"

    def _roll_forward(self) -> None:
        """Carry out what the previous holder's fence accepted and it may not have finished."""
        if self.doc is None or not self.doc.intents:
            return
        for intent in self.doc.intents:
            if "copy" in intent:
                self.objects.copy_and_erase(*intent["copy"])
            elif "delete" in intent:
                self.objects.delete_version(*intent["delete"])
        log.info("lease of %s: %d write(s) of the previous holder finished", self.url, len(self.doc.intents))
        self._swap([], "finishing the previous holder's writes")
