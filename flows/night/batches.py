"""The night's work as plain async functions: configuration, discovery, one batch of clients.

Nothing here knows about Prefect. :mod:`membersync.flows.night.nightly` strings these together
(and Prefect wraps each batch in a task); tests and the benchmark call them directly.

Three steps, each typed with :class:`membersync.models.coerce.BatchBuilder` so Arrow arrays
are built once per batch, not once per HTTP request:

* :func:`fetch_config`: the 13 configuration endpoints (store-scoped ones for every store,
  processor credentials for both types), landed whole.
* :func:`discover`: ``clients/search`` store by store, paged; only clients changed since a
  watermark (the **server's** ``lastModified``) on later nights.
* :func:`fetch_batch`: the per-client fan-out for one batch of clients, every request of the
  batch in flight at once (the client's own concurrency limit meters them).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import pyarrow as pa
from membersync.extract import catalogue
from membersync.extract.concurrency import work_started
from membersync.extract.errors import ServiceError
from membersync.models import tables as T
from membersync.models.coerce import BatchBuilder, Landed, QuarantineRow, TimezoneLookup, quarantine_table

log = logging.getLogger(__name__)

# Client-scoped reads of the fan-out, endpoint -> landed table (transaction history explodes
# into three tables; affiliated package clients come in a second round, see fetch_batch).
SIMPLE_READS: dict[str, str] = {
    "clientdetails": "clients",
    "clientmemberships": "memberships",
    "ledgerbalance": "ledger_balances",
    "pointsbalance": "points_balances",
    "getpointstransactions": "points_transactions",
    "clientpackages": "client_packages",
    "commprefs": "comm_prefs",
    "billinginfo": "billing_accounts",
}
FANOUT_ENDPOINTS: tuple[str, ...] = (*SIMPLE_READS, "transactionhistory")
# Every table a batch writes (present, maybe empty, in every batch so each night's tables
# are complete even when a batch has, say, no billing accounts).
BATCH_TABLES: tuple[str, ...] = (
    "synced_clients",
    *SIMPLE_READS.values(),
    "transactions",
    "transaction_lines",
    "transaction_payments",
    "affiliated_package_clients",
)
CONFIG_TABLES: tuple[str, ...] = tuple(t.name for t in T.CONFIG_TABLES)
CREDENTIAL_TYPES: tuple[str, ...] = catalogue.CREDENTIAL_TYPES


class BatchFailed(RuntimeError):
    """Some clients of a batch could not be fetched; the message says which and why.

    The night must not silently lose a client, so a client whose fetch still fails after the
    client's own retries fails its batch (and so the night). Problems *in the data* are not
    failures: :mod:`membersync.models.coerce` quarantines the rows it cannot type.

    The message never holds a client number (it reaches logs, notifications and Prefect's
    database): a client is named by :meth:`naming`'s ``name_of`` (a night: the surrogate key),
    else by its place in the batch.
    """

    batch: Batch | None = None
    failures: tuple[Failure, ...] = ()

    @classmethod
    def of(
        cls, batch: Batch, failures: list[Failure], name_of: Callable[[str], str] | None = None
    ) -> BatchFailed:
        failed = cls(_failure_message(batch, failures, name_of))  # args: the message (it pickles)
        failed.batch, failed.failures = batch, tuple(failures)
        return failed

    def naming(self, name_of: Callable[[str], str]) -> BatchFailed:
        """The same failure, its clients named by ``name_of(number)``."""
        return self if self.batch is None else BatchFailed.of(self.batch, list(self.failures), name_of)


# --- what a step produces -----------------------------------------------------------------------


@dataclass
class Typed:
    """Arrow tables and quarantined rows of one step, ready for ``night.write_batch``."""

    tables: dict[str, pa.Table]
    quarantine: list[QuarantineRow] = field(default_factory=list)

    @classmethod
    def of(cls, landed: Mapping[str, Landed], names: Iterable[str]) -> Typed:
        """From a builder's output; every table in ``names`` is present (empty if untouched)."""
        tables: dict[str, pa.Table] = {}
        quarantine: list[QuarantineRow] = []
        for name in names:
            got = landed.get(name)
            tables[name] = got.table if got is not None else T.table(name).schema.empty_table()
            if got is not None:
                quarantine.extend(got.quarantine)
        return cls(tables, quarantine)

    @property
    def quarantine_table(self) -> pa.Table | None:
        return quarantine_table(self.quarantine) if self.quarantine else None

    @property
    def rows(self) -> dict[str, int]:
        return {name: t.num_rows for name, t in self.tables.items()}


@dataclass(frozen=True)
class Window:
    """Which history the night fetches for each synced client.

    By default a synced client's **whole** history, every night: a vendor corrects the past
    (a void or a payment on an old sale, a back-dated points adjustment), and a client whose
    history changed is exactly a client the night syncs; the request count is the same as for
    a window (one call per client and endpoint), only the answers are longer. A window
    (``whole_history=False``, ``MEMBERSYNC_WHOLE_HISTORY=off``) is an opt-in for tenants whose
    histories are huge: it misses any change to an event older than the window until a
    ``--full`` night.

    Transaction history without dates is the whole history; points transactions need both
    dates, so the whole history starts at ``points_start`` (configurable). ``end`` is one day
    after the night: a store east of this machine may already be on the next local date.
    """

    points_start: dt.date
    end: dt.date
    history_start: dt.date | None  # None: transaction history without dates (the whole history)

    @classmethod
    def for_night(
        cls,
        night: dt.date,
        last_night: dt.date | None,
        *,
        full: bool,
        lookback_days: int,
        points_start: dt.date,
        whole_history: bool = True,
    ) -> Window:
        end = night + dt.timedelta(days=1)
        if full or last_night is None or whole_history:
            return cls(points_start=points_start, end=end, history_start=None)
        start = last_night - dt.timedelta(days=lookback_days)
        return cls(points_start=start, end=end, history_start=start)

    def describe(self) -> str:
        if self.history_start is None:
            return f"whole history (points from {self.points_start})"
        return f"{self.history_start} .. {self.end}"


# --- configuration --------------------------------------------------------------------------------


async def fetch_config(client: Any) -> tuple[Typed, list[dict[str, Any]]]:
    """Every configuration list, typed; and the raw store list (for timezones and discovery).

    The store list comes first: the store-scoped lists are asked for every store in it, and
    processor credentials for both credential types.
    """
    stores: list[dict[str, Any]] = await client.get("storelist")
    tz = TimezoneLookup.from_stores(stores)
    builder = BatchBuilder(tz)
    builder.add(_table_of("storelist"), stores, {})

    requests: list[tuple[str, dict[str, str], dict[str, str]]] = []  # endpoint, params, context
    for ep in catalogue.CONFIG_ENDPOINTS:
        if ep.name == "storelist":
            continue
        if ep.kind == "config":
            requests.append((ep.name, {}, {}))
            continue
        for storecode in store_codes(stores):
            types = CREDENTIAL_TYPES if any(p.name == "type" for p in ep.params) else (None,)
            for kind in types:
                params = {"storecode": storecode}
                context = {"@storecode": storecode}
                if kind is not None:
                    params["type"] = context["@type"] = kind
                requests.append((ep.name, params, context))

    answers = await asyncio.gather(*(client.get(name, **params) for name, params, _ in requests))
    for (name, _, context), items in zip(requests, answers, strict=True):
        builder.add(_table_of(name), items, context)
    return Typed.of(builder.build(), CONFIG_TABLES), stores


def store_codes(stores: Iterable[Mapping[str, Any]]) -> list[str]:
    """Store codes of the store list, byte-exact (never trimmed), without duplicates."""
    seen: dict[str, None] = {}
    for store in stores:
        code = store.get("storecode") if isinstance(store, Mapping) else None
        if isinstance(code, str):
            seen.setdefault(code, None)
    return list(seen)


def _table_of(endpoint: str) -> T.Table:
    return next(t for t in T.TABLES if t.endpoint == endpoint)


# --- discovery --------------------------------------------------------------------------------------


class ClientRef(NamedTuple):
    """What a night keeps of one client's ``clients/search`` summary (wire values).

    A tuple, not the summary's dict: a night holds every discovered client until it ends, and
    at 100,000 clients a dict each cost ~15 MB more resident memory for the whole night.
    """

    number: str
    home_store: Any
    last_modified: Any

    @classmethod
    def of(cls, item: Mapping[str, Any], stores: dict[Any, Any] | None = None) -> ClientRef:
        """The ref of a summary (or a saved record); ``stores`` shares one string per store code."""
        home = item.get("homeStore")
        if stores is not None and isinstance(home, str):
            home = stores.setdefault(home, home)
        return cls(item.get("clientNumber"), home, item.get("lastModified"))  # type: ignore[arg-type]

    def wire(self) -> dict[str, Any]:
        """The record as the service named it: what lands in synced_clients and is saved."""
        return {"clientNumber": self.number, "homeStore": self.home_store, "lastModified": self.last_modified}


DISCOVERY_FIELDS = frozenset(ClientRef("", None, None).wire())  # what a night keeps of a summary
SUMMARY_IDENTITY = catalogue.PERSONAL_FIELDS["clientSummary"]  # what a hit says of the person


@dataclass(frozen=True)
class Discovery:
    """The clients a night syncs (sorted, unique) and the watermark for the next night."""

    clients: list[ClientRef]
    watermark: str | None
    # the identity values the search hits carried (names, email, phone): masked in free text
    # from the night's first batch on, whichever batch lands the client they belong to
    identity: list[str] = field(default_factory=list)

    @property
    def client_numbers(self) -> list[str]:
        return [c.number for c in self.clients]


def parse_utc(value: object) -> dt.datetime | None:
    """A server ``lastModified`` (``YYYY-MM-DDTHH:MM:SSZ``, or with an offset) as aware UTC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:  # the contract says UTC
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def format_utc(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def modified_since(watermark: str | None, overlap: dt.timedelta) -> str | None:
    """The ``modifiedSince`` for a night after one whose watermark is ``watermark``.

    The overlap re-lists clients changed a little before the watermark: a client changed on
    the server while discovery was paging through another store can carry a ``lastModified``
    below the newest one discovered, and would otherwise be missed for good.
    """
    moment = parse_utc(watermark)
    return None if moment is None else format_utc(moment - overlap)


def summarize_discovery(
    found: Iterable[ClientRef | Mapping[str, Any]], previous_watermark: str | None
) -> Discovery:
    """Deduplicate by clientNumber, sort, and take the newest server ``lastModified``.

    A client whose summary lacks a usable clientNumber cannot be fetched: it is skipped with a
    warning (it lands nowhere, so the count says so). The watermark stays the previous one when
    nothing changed (or nothing carries a readable lastModified).
    """
    by_number: dict[str, ClientRef] = {}
    newest: tuple[dt.datetime, str] | None = None
    skipped = 0
    stores: dict[Any, Any] = {}
    for item in found:
        # discover() hands over refs already; a saved or raw summary becomes one here
        ref = item if isinstance(item, ClientRef) else ClientRef.of(item, stores)
        if not isinstance(ref.number, str) or not ref.number:
            skipped += 1
            continue
        by_number[ref.number] = ref
        moment = parse_utc(ref.last_modified)
        if moment is not None and (newest is None or moment > newest[0]):
            newest = (moment, format_utc(moment))
    if skipped:
        log.warning("discovery: %d client summaries without a clientNumber were skipped", skipped)
    clients = [by_number[n] for n in sorted(by_number)]
    return Discovery(clients, newest[1] if newest else previous_watermark)


async def discover(
    client: Any, storecodes: Sequence[str], since: str | None, previous_watermark: str | None
) -> Discovery:
    """Every client (``since`` None) or the clients changed since ``since``, store by store.

    Stores are listed concurrently; the pages of one store in order (the server sorts by
    clientNumber, and clients are never deleted, so a client inserted meanwhile can only
    push others onto a later page, seen twice and deduplicated, never skipped).
    """

    stores: dict[Any, Any] = {}  # one string object per store code, shared by its clients
    identity: set[str] = set()

    async def one_store(storecode: str) -> list[ClientRef]:
        criteria: dict[str, Any] = {"storecode": storecode}
        if since is not None:
            criteria["modifiedSince"] = since
        items: list[ClientRef] = []
        async for page in client.search(**criteria):
            # Keep only what the night needs, page by page: memory stays small at 100,000 clients.
            hits = [item for item in page.items if isinstance(item, dict)]
            items.extend(ClientRef.of(item, stores) for item in hits)
            identity.update(v for item in hits for k in SUMMARY_IDENTITY if isinstance(v := item.get(k), str))
        return items

    per_store = await asyncio.gather(*(one_store(s) for s in storecodes))
    found = summarize_discovery((item for items in per_store for item in items), previous_watermark)
    return replace(found, identity=sorted(identity))


# --- batches ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    id: str
    clients: tuple[ClientRef, ...]  # sorted by number


def plan_batches(clients: Sequence[ClientRef], size: int) -> list[Batch]:
    """Sorted clients in chunks of ``size``; ids are stable over the saved discovery list."""
    if size < 1:
        raise ValueError("batch size must be at least 1")
    return [
        Batch(f"{i:05d}", tuple(clients[start : start + size]))
        for i, start in enumerate(range(0, len(clients), size))
    ]


def client_numbers(batch: Batch) -> list[str]:
    return [c.number for c in batch.clients]


@dataclass
class Failure:
    what: str  # "membership M-12"; a client's is named when the message is made
    error: str
    client: str | None = None  # the client's number (never shown: see BatchFailed)


def clients_to_ask_about_shares(
    packages_by_client: Mapping[str, list[Any]], affiliated: frozenset[str]
) -> set[str]:
    """Clients whose memberships may have shares, i.e. who **own** an affiliated package.

    ``setup/affiliatedpackageclients`` is selected by a membership id, and the contract gives no
    "has shares" flag. A package can only be shared by its owner, so the memberships worth
    asking about are those of clients holding a package that the night's package list marks
    ``affiliated`` and that they own (``sharedFromClientNumber`` empty: a client using a package
    shared *from* someone else cannot share it further). Every membership of such a client is
    asked about; an empty answer simply lands no row. Asking about every membership of every
    client would double the night's requests for a feature few clients use.
    """
    owners = set()
    for number, packages in packages_by_client.items():
        for package in packages:
            if not isinstance(package, dict):
                continue
            if package.get("packageId") in affiliated and not package.get("sharedFromClientNumber"):
                owners.add(number)
                break
    return owners


@dataclass
class RawBatch:
    """One batch's answers, as received (logical names, untyped)."""

    batch: Batch
    answers: dict[str, dict[str, Any]]  # clientNumber -> endpoint -> answer
    shares: list[tuple[str, Any]]  # (membershipId, affiliatedpackageclients answer)


async def fetch_batch_raw(
    client: Any,
    batch: Batch,
    window: Window,
    affiliated: frozenset[str],
    on_client_done: Callable[[int], None] | None = None,
) -> RawBatch:
    """Fetch one batch; raise :class:`BatchFailed` if any client could not be fetched.

    Round one sends each client's nine reads at once, ``CLIENTS_AT_ONCE`` clients at a time (the
    client's concurrency limit and rate limiter decide how many are really in flight); round two
    asks for the affiliated package clients of the memberships of package owners (see
    :func:`clients_to_ask_about_shares`). Both rounds' requests go ahead of those of batches
    started after this one (:func:`~membersync.extract.limits.work_started`).
    """
    with work_started():
        return await _fetch_both_rounds(client, batch, window, affiliated, on_client_done)


async def _fetch_both_rounds(
    client: Any,
    batch: Batch,
    window: Window,
    affiliated: frozenset[str],
    on_client_done: Callable[[int], None] | None,
) -> RawBatch:
    failures: list[Failure] = []
    results = await _fetch_clients(client, batch.clients, window, failures, on_client_done)
    answers = {c.number: r for c, r in zip(batch.clients, results, strict=True) if r is not None}

    packages = {n: a.get("clientpackages") or [] for n, a in answers.items()}
    owners = clients_to_ask_about_shares(packages, affiliated)
    membership_ids = sorted(
        {
            m["membershipId"]
            for n in owners
            for m in (answers[n].get("clientmemberships") or [])
            if isinstance(m, dict) and isinstance(m.get("membershipId"), str)
        }
    )
    shares = await _gather_failing(
        client, [("affiliatedpackageclients", {"membershipId": mid}, mid) for mid in membership_ids], failures
    )
    if failures:
        raise BatchFailed.of(batch, failures)
    return RawBatch(batch, answers, shares)


def type_batch(raw: RawBatch, tz: TimezoneLookup) -> Typed:
    """Type a fetched batch into its tables (every table of :data:`BATCH_TABLES`, maybe empty)."""
    builder = BatchBuilder(tz)
    builder.add("synced_clients", [c.wire() for c in raw.batch.clients], {})
    for number, got in raw.answers.items():
        context = {"clientNumber": number}
        for endpoint, table in SIMPLE_READS.items():
            builder.add(table, got[endpoint], context)
        builder.add_transactions(got["transactionhistory"] or [], number)
    for membership_id, items in raw.shares:
        builder.add("affiliated_package_clients", items, {"@membershipId": membership_id})
    return Typed.of(builder.build(), BATCH_TABLES)


async def fetch_batch(
    client: Any,
    batch: Batch,
    window: Window,
    affiliated: frozenset[str],
    tz: TimezoneLookup,
    on_client_done: Callable[[int], None] | None = None,
) -> Typed:
    """:func:`fetch_batch_raw` then :func:`type_batch`."""
    return type_batch(await fetch_batch_raw(client, batch, window, affiliated, on_client_done), tz)


# Clients of a batch fetched at a time, their nine reads each sent together: enough to keep the
# client's concurrency (at most MAX_CONCURRENCY in flight) and its pace busy from one batch, few
# enough that a batch's start does not hold the event loop. Setting up all of a batch's 2,250
# requests at once held it 100-200 ms at each start, pace lost at 500 req/s (traced).
CLIENTS_AT_ONCE = 32


async def _fetch_clients(
    client: Any,
    clients: Sequence[ClientRef],
    window: Window,
    failures: list[Failure],
    on_done: Callable[[int], None] | None,
) -> list[dict[str, Any] | None]:
    """:func:`_fetch_client` for each client, ``CLIENTS_AT_ONCE`` at a time; answers in order."""
    results: list[dict[str, Any] | None] = [None] * len(clients)
    todo = iter(enumerate(clients))

    async def worker() -> None:
        for i, record in todo:  # one iterator: each client is taken by one worker
            results[i] = await _fetch_client(client, record.number, window, failures, on_done)

    await asyncio.gather(*(worker() for _ in range(min(CLIENTS_AT_ONCE, len(clients)))))
    return results


async def _fetch_client(
    client: Any,
    number: str,
    window: Window,
    failures: list[Failure],
    on_done: Callable[[int], None] | None,
) -> dict[str, Any] | None:
    """The nine reads of one client, or None (and a recorded failure) if any failed."""
    calls: list[Awaitable[Any]] = [
        client.get("clientdetails", clientNumber=number),
        client.get("clientmemberships", clientNumber=number),
        client.get("ledgerbalance", clientNumber=number),
        client.get("pointsbalance", clientNumber=number),
        client.get(
            "getpointstransactions",
            clientNumber=number,
            startDate=window.points_start.isoformat(),
            endDate=window.end.isoformat(),
        ),
        client.get("clientpackages", clientNumber=number),
        client.get("commprefs", clientNumber=number),
        client.get("billinginfo", clientNumber=number),
        client.get("transactionhistory", clientNumber=number, **_history_params(window)),
    ]
    names = (*SIMPLE_READS, "transactionhistory")
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [(n, r) for n, r in zip(names, results, strict=True) if isinstance(r, BaseException)]
    if on_done is not None:
        on_done(1)
    if errors:
        for _, exc in errors:
            if not isinstance(exc, Exception):  # cancellation and the like are not a client's failure
                raise exc
        failures.append(Failure("client", "; ".join(_describe(n, e) for n, e in errors), number))
        return None
    return dict(zip(names, results, strict=True))


def _history_params(window: Window) -> dict[str, str]:
    if window.history_start is None:
        return {}
    return {"startDate": window.history_start.isoformat(), "endDate": window.end.isoformat()}


async def _gather_failing(
    client: Any, requests: list[tuple[str, dict[str, str], str]], failures: list[Failure]
) -> list[tuple[str, Any]]:
    """Run ``client.get`` for each request; failures are recorded under the request's label."""
    results = await asyncio.gather(
        *(client.get(name, **params) for name, params, _ in requests), return_exceptions=True
    )
    out = []
    for (name, _, label), result in zip(requests, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            failures.append(Failure(f"membership {label}", _describe(name, result)))
        else:
            out.append((label, result))
    return out


def _describe(endpoint: str, exc: BaseException) -> str:
    # ServiceError's text names endpoint and status and never holds a secret; anything else
    # is a bug, shown by class and message.
    return str(exc) if isinstance(exc, ServiceError) else f"{endpoint}: {type(exc).__name__}: {exc}"


def _failure_message(batch: Batch, failures: Sequence[Failure], name_of: Callable[[str], str] | None) -> str:
    numbers = client_numbers(batch)

    def name(failure: Failure) -> tuple[str, str]:
        if failure.client is None:
            return failure.what, failure.error
        label = name_of(failure.client) if name_of else f"#{numbers.index(failure.client) + 1} of the batch"
        # a server's message may echo the number it was asked for
        echoed = rf"(?<![0-9]){re.escape(failure.client)}(?![0-9])"
        return f"client {label}", re.sub(echoed, label, failure.error)

    shown = "; ".join(": ".join(name(f)) for f in failures[:3])
    more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
    return (
        f"batch {batch.id} ({len(batch.clients)} clients): {len(failures)} could not be fetched "
        f"after retries, so the night is not committed: {shown}{more}"
    )
