"""Surrogate client keys, the identity they link to, and the register of erasures.

Every landed table carries a client's **surrogate key**; the landing zone's ``client_identity``
files hold the only link from a key to a client number and a person (see
:mod:`membersync.models.privacy`). This module gives a night its :class:`ClientKeys` (the
key of every number it lands), reads the identity files, and keeps the **erasure register**:

``privacy/erasures.json`` in the data location (the bucket, for ``s3://``)::

    {"format": 1, "erasures": [
       {"id": "...", "requested_at": "...Z", "reason": "...", "status": "pending" | "done",
        "clients": [{"hmac": "<HMAC-SHA256 of the client number>", "key": "k..."}],
        "plan": {...}, "result": {...}}]}

It holds no personal data: a client number only as a keyed hash, whose key (per data location)
lives **outside** the data location (``MEMBERSYNC_ERASURE_KEY_FILE``, default
``~/.config/membersync/erasure-<location digest>.key``), so a copy of the data cannot test a
number against it. It is also the suppression list: a forgotten client the vendor still serves
lands on their old key, and their identity never lands again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from membersync.models import tables as T
from membersync.models.mask import IDENTIFYING_FIELDS, MASKED_FIELDS, IdentityMask
from membersync.warehouse.landing.atomic import make_dirs, write_bytes_atomic
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

REGISTER = "privacy/erasures.json"  # relative to the data location's root
REGISTER_FORMAT = 1
KEY_PREFIX = "k"
_KEY_DIGITS = (16, 24, 32)  # a key's hex digits (longer only on a collision: never seen)


class ErasureKeyError(RuntimeError):
    """The erasure register needs its key file and cannot have it; the message says what to do."""


# --- the register's key --------------------------------------------------------------------------


def key_file(data_dir: DataDir, configured: str | None = None) -> Path:
    """Where the HMAC key of this data location's register lives (outside the data location):
    ``configured``, else ``MEMBERSYNC_ERASURE_KEY_FILE``, else one per data location under the
    user's configuration folder."""
    from membersync.extract.settings import Settings

    configured = configured or Settings.load().erasure_key_file
    if configured:
        return Path(configured).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "membersync"
    digest = hashlib.sha256(data_dir.location.encode()).hexdigest()[:16]
    return base / f"erasure-{digest}.key"


def read_key(path: Path, *, create: bool) -> bytes:
    """The key in ``path``; a new one (0600) only when ``create`` and there is none yet. Callers
    go through :func:`erasure_key`, which never creates one for a register that has erasures."""
    try:
        text = path.read_text(encoding="ascii").strip()
        key = bytes.fromhex(text)
        if len(key) < 16:
            raise ValueError("too short")
        return key
    except FileNotFoundError:
        if not create:
            raise ErasureKeyError(
                f"the erasure register's key file {path} is missing: restore it from your backup "
                "and point MEMBERSYNC_ERASURE_KEY_FILE at it; without it forgotten clients cannot be "
                "recognised, so nothing is landed"
            ) from None
    except (OSError, ValueError) as exc:
        raise ErasureKeyError(f"cannot read the erasure register's key file {path}: {exc}") from None
    make_dirs(path.parent)
    write_bytes_atomic(path, secrets.token_hex(32).encode())
    log.info("created the erasure register's key file %s (back it up; keep it outside the data)", path)
    return read_key(path, create=False)


KEY_CHECK_LABEL = b"membersync erasure register key check"


def key_check(key: bytes) -> str:
    """What the register records of its key: an HMAC of a fixed label, so a different key (a
    key file made again elsewhere) is recognised as the wrong one, and the key cannot be derived."""
    return hmac.new(key, KEY_CHECK_LABEL, hashlib.sha256).hexdigest()[:32]


def erasure_key(zone: Any, *, create: bool) -> bytes:
    """The erasure register's key, checked against the register. A new key is made only for a
    register that has never recorded an erasure: once one exists, a missing or different key is
    an :class:`ErasureKeyError` naming ``MEMBERSYNC_ERASURE_KEY_FILE`` (a new key would not
    recognise the clients forgotten before, and a night would land them again)."""
    register = read_register(zone.store)
    path = key_file(zone.data_dir, zone.erasure_key_file)
    started = bool(register.erasures) or register.key_check is not None
    key = read_key(path, create=create and not started)
    if register.key_check is not None and not hmac.compare_digest(register.key_check, key_check(key)):
        raise ErasureKeyError(
            f"the erasure key file {path} is not the key of {zone.data_dir.location}'s erasure register: "
            "point MEMBERSYNC_ERASURE_KEY_FILE at the key made by its first `membersync forget`"
        )
    return key


def client_hmac(key: bytes, number: str) -> str:
    return hmac.new(key, number.encode(), hashlib.sha256).hexdigest()


# --- the register ----------------------------------------------------------------------------------


@dataclass
class Erasure:
    """One ``membersync forget`` (or retention's identity horizon): who, when, why, what it did."""

    id: str
    requested_at: str
    reason: str
    clients: list[dict[str, Any]]  # {"hmac": ..., "key": ..., "words": [keyed hashes]}
    status: str = "pending"
    plan: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return [c["key"] for c in self.clients]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "requested_at": self.requested_at,
            "reason": self.reason,
            "status": self.status,
            "clients": self.clients,
            "plan": self.plan,
            "result": self.result,
        }


@dataclass
class ErasureRegister:
    erasures: list[Erasure]
    version: str | None = None  # the store's version of the file read (a conditional write's base)
    key_check: str | None = None  # :func:`key_check` of the register's key, once it has one

    @property
    def erased(self) -> dict[str, str]:
        """hmac of the client number -> surrogate key, for every client ever forgotten."""
        return {c["hmac"]: c["key"] for e in self.erasures for c in e.clients}

    @property
    def hashed_words(self) -> set[str]:
        """The keyed hashes of every forgotten client's identifying words (see models.mask)."""
        return {w for e in self.erasures for c in e.clients for w in c.get("words", ())}

    @property
    def pending(self) -> list[Erasure]:
        return [e for e in self.erasures if e.status != "done"]

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"format": REGISTER_FORMAT, "erasures": [e.as_dict() for e in self.erasures]}
        if self.key_check is not None:
            body["key_check"] = self.key_check
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | None, version: str | None, where: str) -> ErasureRegister:
        if data is None:
            return cls([], version)
        try:
            body = json.loads(data)
            if body.get("format") != REGISTER_FORMAT:
                raise ValueError(f"unknown format {body.get('format')!r}")
            return cls([Erasure(**e) for e in body["erasures"]], version, body.get("key_check"))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{where}: the erasure register is malformed ({exc})") from None


def read_register(store: Any) -> ErasureRegister:
    data, version = store.read_doc(REGISTER)
    return ErasureRegister.from_json(data, version, REGISTER)


def write_register(store: Any, register: ErasureRegister) -> None:
    register.version = store.write_doc(REGISTER, register.to_json(), register.version)


def new_erasure_id() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


# --- the identity files ----------------------------------------------------------------------------


def identity_files(
    manifests: Iterable[Manifest], tables: Iterable[str] | None = None
) -> list[tuple[Manifest, str, str]]:
    """(manifest, table, file) of every committed personal file (``client_identity`` and
    ``client_demographics``, or the ``tables`` given)."""
    names = set(tables) if tables is not None else {t.name for t in T.IDENTITY_TABLES}
    return [
        (m, name, f)
        for m in manifests
        for name, files in sorted(m.tables.items())
        if name in names
        for f in files.files
    ]


def read_links(store: Any, manifests: Iterable[Manifest]) -> pa.Table:
    """Every committed identity version: snapshot_date, client_key, client_number, identity_digest."""
    schema = T.CLIENT_IDENTITY.schema
    parts = []
    for manifest, _, relative in identity_files(manifests, [T.CLIENT_IDENTITY.name]):
        table = store.read_table(relative, schema).select(["client_key", "client_number", "identity_digest"])
        night = pa.array([manifest.snapshot_date] * table.num_rows, pa.date32())
        parts.append(table.append_column("snapshot_date", night))
    if not parts:
        empty = schema.empty_table().select(["client_key", "client_number", "identity_digest"])
        return empty.append_column("snapshot_date", pa.array([], pa.date32()))
    return pa.concat_tables(parts)


def read_identity_values(
    store: Any,
    manifests: Iterable[Manifest],
    keys: Iterable[str] | None = None,
    fields: Sequence[str] = IDENTIFYING_FIELDS,
) -> dict[str, set[str]]:
    """Client key -> every value of ``fields`` the committed identity files hold for them (all
    versions; only the clients of ``keys`` when given), in one pass over the files."""
    wanted = None if keys is None else pa.array(sorted(set(keys)), pa.string())
    out: dict[str, set[str]] = {}
    for _, _, relative in identity_files(manifests, [T.CLIENT_IDENTITY.name]):
        table = store.read_table(relative, T.CLIENT_IDENTITY.schema)
        if wanted is not None:
            table = table.filter(pc.is_in(table["client_key"], value_set=wanted))
        columns = [table[c].to_pylist() for c in ("client_key", *fields)]
        for key, *values in zip(*columns, strict=True):
            out.setdefault(key, set()).update(v for v in values if isinstance(v, str))
    return out


def identity_mask(
    zone: Any, manifests: Iterable[Manifest], register_key: bytes | None, numbers: Iterable[str]
) -> IdentityMask:
    """The mask of untrusted text: every held client's names, email, phone and number
    (``numbers``: the links), and the forgotten clients' words as the register holds them."""
    values = read_identity_values(zone.store, manifests, fields=MASKED_FIELDS)
    mask = IdentityMask(v for held in values.values() for v in held)
    mask.add_numbers(numbers)
    if register_key is not None:
        mask.add_hashed(register_key, read_register(zone.store).hashed_words)
    return mask


# --- the keys of a night --------------------------------------------------------------------------


class ClientKeys:
    """The surrogate key each client number lands under, in one run of one night.

    A number already linked (a committed ``client_identity`` row) keeps its key; a forgotten
    one (in the register) gets the register's key and lands no identity; a new one gets a new
    key derived from the run's random salt (HMAC), so every batch of the run, and a resumed run,
    gives the same new client the same key, while nothing outside the run can recompute it."""

    def __init__(
        self,
        links: Mapping[str, str],
        digests: Mapping[str, str | None],
        erased: Mapping[str, str],
        salt: bytes,
        register_key: bytes | None,
    ) -> None:
        self.links = dict(links)  # number -> key
        self.digests = dict(digests)  # number -> newest digest held (other nights)
        self.linked = set(digests)  # numbers with an identity row held (other nights) or landed now
        self.erased = dict(erased)  # hmac -> key
        self.taken = set(self.links.values()) | set(self.erased.values())
        self.salt = salt
        self.register_key = register_key
        self.suppressed: set[str] = set()
        self.tonight: set[str] = set()  # the night's discovered clients (each lands in its batch)
        self.mask = IdentityMask()  # identity values masked in untrusted text (load: the held ones)
        self._checked: set[str] = set()

    @classmethod
    def load(cls, zone: Any, salt: bytes, replacing: dt.date | None) -> ClientKeys:
        """The keys held by the zone's committed nights; ``replacing``: the night this run's
        commit replaces (its identity rows go with it, so they do not count as held)."""
        links_table = read_links(zone.store, zone.manifests())
        links: dict[str, str] = {}
        digests: dict[str, str | None] = {}
        order = links_table.sort_by("snapshot_date")
        for number, key, digest, night in zip(
            *(
                order[c].to_pylist()
                for c in ("client_number", "client_key", "identity_digest", "snapshot_date")
            ),
            strict=True,
        ):
            links[number] = key
            if night != replacing:
                digests[number] = digest if digest is not None else digests.get(number)
        register = read_register(zone.store)
        register_key = None
        if register.erasures:
            register_key = erasure_key(zone, create=False)
        keys = cls(links, digests, register.erased, salt, register_key)
        keys.mask = identity_mask(zone, zone.manifests(), register_key, links)
        return keys

    def assign(self, numbers: Iterable[str]) -> dict[str, str]:
        out = {}
        for number in numbers:
            if number not in self._checked:
                self._check_erased(number)
            key = self.links.get(number)
            if key is None:
                key = self.links[number] = self._new_key(number)
            out[number] = key
        return out

    def _check_erased(self, number: str) -> None:
        self._checked.add(number)
        if self.register_key is None:
            return
        key = self.erased.get(client_hmac(self.register_key, number))
        if key is not None:
            self.suppressed.add(number)
            self.links[number] = key

    def _new_key(self, number: str) -> str:
        digest = hmac.new(self.salt, number.encode(), hashlib.sha256).hexdigest()
        for digits in _KEY_DIGITS:
            key = KEY_PREFIX + digest[:digits]
            if key not in self.taken:
                self.taken.add(key)
                return key
        raise RuntimeError("three surrogate keys of different lengths collided")  # pragma: no cover

    def wants_identity(self, number: str, digest: str) -> bool:
        if number in self.suppressed or self.digests.get(number) == digest:
            return False
        self.digests[number] = digest
        self.linked.add(number)
        return True

    def wants_link(self, number: str, synced_here: bool) -> bool:
        if number in self.suppressed or number in self.linked:
            return False
        if number in self.tonight and not synced_here:
            return False  # its own batch lands its identity (or its link)
        self.linked.add(number)
        return True
