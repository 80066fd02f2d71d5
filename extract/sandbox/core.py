"""The state of the sandbox's service: :class:`ServiceCore` holds the ground truth, builds it
(for the data generator and the writes) and looks it up (404/400 naming the field). The endpoints
are its subclasses :class:`~.reads.Reads` and :class:`~.writes.Writes`, joined in
:class:`~.state.Service`.

Ground truth attributes (see :mod:`membersync.extract.sandbox.model` for the record types):

==========================  =====================================================================
``stores``                  ``dict[storecode, Store]`` (storecodes are exactly 10 characters)
``package_types``           ``dict[packageId, PackageType]``
``eft_types``               ``dict[membershipTypeId, EftMembershipType]``
``noneft_types``            ``dict[membershipTypeId, NonEftMembershipType]``
``deduct_types``            ``dict[code, description]``
``draw_days``               ``dict[int day, description]``
``skin_type_codes``         ``dict[code, description]``
``webdoc_names``            ``dict[docId, name]``
``store_payment_types``     ``dict[storecode, list[PaymentType]]``
``store_employees``         ``dict[storecode, list[Employee]]``
``store_products``          ``dict[storecode, list[Product]]``
``credentials``             ``list[ProcessorCredentials]`` (one or two per store and type)
``questions``               ``dict[questionId, ProfileQuestion]``
``clients``                 ``dict[clientNumber, Client]``; each client holds ``ledger``
                            (``dict[storecode, Decimal]``), ``points`` (``dict[storecode, int]``),
                            ``memberships``, ``packages`` (owned), ``transactions``,
                            ``points_transactions``, ``billing_accounts``, ``comm_prefs``
``memberships``             ``dict[membershipId, Membership]`` (all clients)
``transactions``            ``dict[receiptNumber, Transaction]`` (``local_datetime`` canonical,
                            ``status`` Saved/Voided, ``lines``, ``payments``, ``total``)
``billing_accounts``        ``dict[billingAccountId, BillingAccount]``
``affiliated``              ``dict[membershipId, ClientPackage]``: the owner's shareable package
``shares``                  ``dict[membershipId, dict[clientNumber, date shared]]``
``gift_certs``, ``users``,  inserted gift certificates, registered users (password hashed),
``referrals``               referrals
``anchor``, ``floor``       the anchor date; its start in UTC (every generated ``last_modified``
                            is before ``floor``; every change is stamped at or after it)
==========================  =====================================================================

Generated clients are filled lazily: the generator makes every client's core (demographics,
``last_modified``, ``comm_prefs``, ``ledger``) at start-up and what the client holds
(memberships, packages, transactions, points, billing accounts) on first use, from a random
stream of its own, so the result does not depend on the order of requests. **Before reading
the holdings of many clients as ground truth, call** :meth:`ServiceCore.materialize_all` (the test
fixtures and ``start_in_thread`` do it unless ``lazy=True``), or use :meth:`ServiceCore.client`.
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
from collections.abc import Callable, Iterable
from typing import Any
from zoneinfo import ZoneInfo

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.validation import (
    JSON,
    UTC,
    ApiError,
    _given,
    bad,
    invalid,
    missing,
    not_found,
)

RECEIPT_SUFFIX = 3  # a generated receipt number is the client number + 3 digits


class ServiceCore:
    """The service's state, its building and its lookups (see the module docstring for the attributes)."""

    def __init__(
        self,
        anchor: dt.date,
        *,
        max_page_size: int = catalogue.MAX_PAGE_SIZE,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.anchor = anchor
        self.floor = dt.datetime.combine(anchor, dt.time(), UTC)
        self.max_page_size = max_page_size
        self.clock: Callable[[], dt.datetime] = clock or (lambda: dt.datetime.now(UTC))
        # configuration
        self.stores: dict[str, m.Store] = {}
        self.package_types: dict[str, m.PackageType] = {}
        self.eft_types: dict[str, m.EftMembershipType] = {}
        self.noneft_types: dict[str, m.NonEftMembershipType] = {}
        self.deduct_types: dict[str, str] = {}
        self.draw_days: dict[int, str] = {}
        self.skin_type_codes: dict[str, str] = {}
        self.webdoc_names: dict[str, str] = {}
        self.store_payment_types: dict[str, list[m.PaymentType]] = {}
        self.store_employees: dict[str, list[m.Employee]] = {}
        self.store_products: dict[str, list[m.Product]] = {}
        self.credentials: list[m.ProcessorCredentials] = []
        self.questions: dict[str, m.ProfileQuestion] = {}
        # fields a tenant's server adds to one client's answers, beyond the contract (an
        # emergency contact, a household member): (endpoint, client number) -> fields per item
        self.tenant_fields: dict[tuple[str, str], dict[str, Any]] = {}
        # answers a tenant's server refuses for one client, in its own words (a vendor's message
        # may name the person): (endpoint, client number) -> (status, code, message)
        self.tenant_refusals: dict[tuple[str, str], tuple[int, str, str]] = {}
        # clients and what they hold
        self.clients: dict[str, m.Client] = {}
        self.memberships: dict[str, m.Membership] = {}
        self.transactions: dict[str, m.Transaction] = {}
        self.billing_accounts: dict[str, m.BillingAccount] = {}
        self.affiliated: dict[str, m.ClientPackage] = {}
        self.shares: dict[str, dict[str, dt.date]] = {}
        self.shared_with: dict[str, set[str]] = {}  # sharee clientNumber -> membershipIds
        self.gift_certs: dict[str, m.GiftCert] = {}
        self.referrals: list[m.Referral] = []
        self.users: dict[str, m.User] = {}
        self.counters: dict[str, int] = {}
        self._zones: dict[str, ZoneInfo] = {}
        self._sorted_numbers: list[str] = []
        self._version = 0  # bumped on every client change (invalidates the search cache)
        self._search_cache: dict[tuple[Any, ...], list[str]] = {}
        self._dummy_salt = os.urandom(16)
        # Fills in a generated client's holdings on first use (set by the generator).
        self.filler: Callable[[m.Client], None] | None = None

    # --- lazy holdings ------------------------------------------------------------------------

    def fill(self, client: m.Client) -> m.Client:
        if not client.filled and self.filler is not None:
            client.filled = True
            self.filler(client)
        return client

    def materialize_all(self) -> None:
        """Fill every client's holdings (makes the global indexes complete for ground truth)."""
        for client in list(self.clients.values()):
            self.fill(client)

    @property
    def materialized(self) -> bool:
        return all(c.filled for c in self.clients.values())

    def client(self, client_number: str) -> m.Client:
        """The whole client (holdings filled in); KeyError when unknown."""
        return self.fill(self.clients[client_number])

    def _owner_of(self, ident: str, prefix: str = "", suffix_len: int = 0) -> None:
        """Fill the client a generated id belongs to (ids embed the owner's client number)."""
        if prefix and ident.startswith(prefix) and "-" in ident:
            number = ident[len(prefix) : ident.rindex("-")]
        elif suffix_len and len(ident) > suffix_len:
            number = ident[:-suffix_len]
        else:
            return
        client = self.clients.get(number)
        if client is not None:
            self.fill(client)

    # --- building (used by the data generator and by writes) ----------------------------------

    def next_id(self, kind: str, fmt: str) -> str:
        """The next id of a kind, formatted with ``fmt`` (e.g. ``"M{:07d}"``)."""
        n = self.counters.get(kind, 0) + 1
        self.counters[kind] = n
        return fmt.format(n)

    def add_store(self, store: m.Store) -> None:
        self.stores[store.storecode] = store
        self._zones[store.storecode] = ZoneInfo(store.timezone)

    def add_client(self, client: m.Client) -> None:
        self.clients[client.client_number] = client
        numbers = self._sorted_numbers
        if not numbers or client.client_number > numbers[-1]:
            numbers.append(client.client_number)
        else:
            bisect.insort(numbers, client.client_number)
        self._version += 1

    def add_membership(self, ms: m.Membership) -> None:
        self.memberships[ms.membership_id] = ms
        self.clients[ms.client_number].memberships.append(ms)

    def add_transaction(self, txn: m.Transaction) -> None:
        self.transactions[txn.receipt_number] = txn
        self.clients[txn.client_number].transactions.append(txn)

    def add_billing_account(self, account: m.BillingAccount) -> None:
        self.billing_accounts[account.billing_account_id] = account
        self.clients[account.client_number].billing_accounts.append(account)

    def share(self, membership_id: str, client_number: str, day: dt.date) -> None:
        self.shares.setdefault(membership_id, {})[client_number] = day
        self.shared_with.setdefault(client_number, set()).add(membership_id)

    def zone(self, storecode: str) -> ZoneInfo:
        return self._zones[storecode]

    def now(self) -> dt.datetime:
        """The time of a change: the real clock, never before any generated ``last_modified``."""
        return max(self.clock().astimezone(UTC).replace(microsecond=0), self.floor)

    def local_now(self, storecode: str) -> dt.datetime:
        # a membership may sit at a storecode outside the store list (no timezone known): UTC then
        return self.now().astimezone(self._zones.get(storecode, UTC)).replace(tzinfo=None)

    def touch(self, *clients: m.Client) -> dt.datetime:
        stamp = self.now()
        for client in clients:
            client.last_modified = stamp
        self._version += 1
        return stamp

    # --- lookups ------------------------------------------------------------------------------

    def _store(self, storecode: object, name: str = "storecode") -> m.Store:
        if storecode is None or storecode == "":
            raise missing(name)
        if not isinstance(storecode, str) or len(storecode) != 10:
            raise bad("invalid_storecode", f"{name} must be exactly 10 characters")
        store = self.stores.get(storecode)
        if store is None:
            raise ApiError(404, "store_not_found", f"{name} {storecode!r} not found")
        return store

    def _client(self, client_number: object, name: str = "clientNumber", fill: bool = True) -> m.Client:
        if client_number is None or client_number == "":
            raise missing(name)
        client = self.clients.get(client_number) if isinstance(client_number, str) else None
        if client is None:
            raise not_found(name, client_number)
        return self.fill(client) if fill else client

    def _membership(self, membership_id: object) -> m.Membership:
        if membership_id is None or membership_id == "":
            raise missing("membershipId")
        if not isinstance(membership_id, str):
            raise not_found("membershipId", membership_id)
        ms = self.memberships.get(membership_id)
        if ms is None:
            self._owner_of(membership_id, prefix="M")
            ms = self.memberships.get(membership_id)
        if ms is None:
            raise not_found("membershipId", membership_id)
        return ms

    def _transaction(self, receipt_number: object) -> m.Transaction:
        if not isinstance(receipt_number, str):
            raise not_found("receiptNumber", receipt_number)
        txn = self.transactions.get(receipt_number)
        if txn is None:
            self._owner_of(receipt_number, suffix_len=RECEIPT_SUFFIX)
            txn = self.transactions.get(receipt_number)
        if txn is None:
            raise not_found("receiptNumber", receipt_number)
        return txn

    def _membership_of(self, client: m.Client, membership_id: object) -> m.Membership:
        ms = self._membership(membership_id)
        if ms.client_number != client.client_number:
            raise ApiError(
                404,
                "membership_not_found",
                f"membershipId {membership_id!r} not found for clientNumber {client.client_number!r}",
            )
        return ms

    def _employee(self, store: m.Store, emp_no: str, name: str = "empNo") -> m.Employee:
        for emp in self.store_employees.get(store.storecode, ()):
            if emp.emp_no == emp_no and emp.active:
                return emp
        raise invalid(name, f"{emp_no!r} is not an employee of store {store.storecode!r}")

    def _payment_type(self, store: m.Store, code: str) -> m.PaymentType:
        for pt in self.store_payment_types.get(store.storecode, ()):
            if pt.code.lower() == code.lower():
                return pt
        raise invalid("paymentType", f"{code!r} is not a payment type of store {store.storecode!r}")

    def _require(self, body: JSON, endpoint_name: str) -> None:
        """The body fields the catalogue marks required are present (400 naming the first missing)."""
        if not isinstance(body, dict):
            raise bad("invalid_body", "the request body must be a JSON object")
        for name in catalogue.endpoint(endpoint_name).required:
            if not _given(body, name):
                raise missing(name)

    # who shares an affiliated package (its read, and the answer of sharing and unsharing)

    def _sharing(self, membership_id: str) -> list[JSON]:
        shared = self.shares.get(membership_id, {})
        out = []
        for number in sorted(shared):
            c = self.clients[number]
            out.append(
                {
                    "clientNumber": number,
                    "firstName": c.first_name,
                    "lastName": c.last_name,
                    "sharedDate": shared[number].isoformat(),
                }
            )
        return out

    # --- helpers for tests and reports -----------------------------------------------------------

    def iter_clients(self) -> Iterable[m.Client]:
        """Every client in clientNumber order, holdings filled in."""
        return (self.fill(self.clients[n]) for n in self._sorted_numbers)
