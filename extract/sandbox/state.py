"""The sandbox's whole service in memory: state, one method per operation, validation. No HTTP.

:class:`Service` is the ground truth of the sandbox. Every endpoint of the catalogue is one
method named like the endpoint (``service.clientdetails("000417")``,
``service.insert_transaction(body)``), so the HTTP layer dispatches with
``getattr(service, endpoint.name)``. Reads take typed arguments (snake_case of the logical
query parameters); writes take the request body (a dict with the contract's logical field
names). Every method answers the contract's JSON (logical names, JSON-ready values) or
raises :class:`ApiError` (status, snake_case code, a message naming the field).

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
the holdings of many clients as ground truth, call** :meth:`Service.materialize_all` (the test
fixtures and ``start_in_thread`` do it unless ``lazy=True``), or use :meth:`Service.client`.
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox import render

JSON = dict[str, Any]
UTC = dt.UTC

COMM_PREFS = ("email", "sms", "mail", "phone", "marketing")
DEMOGRAPHIC_FIELDS = {
    "firstName": "first_name",
    "lastName": "last_name",
    "email": "email",
    "phone": "phone",
    "birthDate": "birth_date",
    "gender": "gender",
    "address1": "address1",
    "city": "city",
    "state": "state",
    "postalCode": "postal_code",
    "homeStore": "home_store",
    "referredBy": "referred_by",
    "skinType": "skin_type",
}
MIN_PASSWORD = 8
RECEIPT_SUFFIX = 3  # a generated receipt number is the client number + 3 digits
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ApiError(Exception):
    """A refusal of the service: HTTP status, snake_case code, message naming the field."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> JSON:
        return {"error": {"code": self.code, "message": self.message}}


def bad(code: str, message: str) -> ApiError:
    return ApiError(400, code, message)


def missing(field: str) -> ApiError:
    return bad("missing_field", f"{field} is required")


def invalid(field: str, why: str) -> ApiError:
    return bad("invalid_value", f"{field} {why}")


def not_found(field: str, value: object) -> ApiError:
    return ApiError(
        404,
        f"{_snake(field).removesuffix('_number').removesuffix('_id')}_not_found",
        f"{field} {value!r} not found",
    )


def conflict(code: str, message: str) -> ApiError:
    return ApiError(409, code, message)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# --- body field parsers (each names the field in its error) -------------------------------------


def _given(body: JSON, name: str) -> bool:
    value = body.get(name)
    return value is not None and value != ""


def _text(body: JSON, name: str, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise missing(name)
        return None
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    return value


def _req_text(body: JSON, name: str) -> str:
    value = _text(body, name)
    assert value is not None
    return value


def _int(body: JSON, name: str, required: bool = True) -> int | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise missing(name)
        return None
    if isinstance(value, bool):
        raise invalid(name, "must be a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise invalid(name, "must be a whole number")


def _req_int(body: JSON, name: str) -> int:
    value = _int(body, name)
    assert value is not None
    return value


def parse_money(value: object, name: str) -> Decimal:
    """A JSON number or numeric string with at most 2 decimals -> Decimal (2 places)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise invalid(name, "must be an amount (number or numeric string)")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise invalid(name, "must be an amount (number or numeric string)") from None
    if not amount.is_finite():
        raise invalid(name, "must be a finite amount")
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -2 and amount != amount.quantize(m.CENT):
        raise invalid(name, "must have at most 2 decimals")
    return amount.quantize(m.CENT)


def _money(body: JSON, name: str, *, positive: bool = False, default: Decimal | None = None) -> Decimal:
    value = body.get(name)
    if value is None or value == "":
        if default is not None:
            return default
        raise missing(name)
    amount = parse_money(value, name)
    if positive and amount <= 0:
        raise invalid(name, "must be greater than 0")
    if amount < 0:
        raise invalid(name, "must not be negative")
    return amount


def _bool(body: JSON, name: str, default: bool | None = None) -> bool:
    value = body.get(name)
    if value is None:
        if default is None:
            raise missing(name)
        return default
    if not isinstance(value, bool):
        raise invalid(name, "must be true or false")
    return value


def parse_date(value: object, name: str) -> dt.date:
    if not isinstance(value, str) or not _DATE.fullmatch(value):
        raise bad("invalid_date", f"{name} must be a date YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise bad("invalid_date", f"{name} must be a date YYYY-MM-DD") from None


def _date(body: JSON, name: str, required: bool = True) -> dt.date | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise missing(name)
        return None
    return parse_date(value, name)


def parse_utc(value: str, name: str) -> dt.datetime:
    """``YYYY-MM-DDTHH:MM:SSZ`` (an offset is honoured; no offset = UTC)."""
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise bad("invalid_datetime", f"{name} must be a UTC datetime YYYY-MM-DDTHH:MM:SSZ") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def hash_password(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


def add_months(day: dt.date, months: int) -> dt.date:
    month0 = day.month - 1 + months
    year, month = day.year + month0 // 12, month0 % 12 + 1
    return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


class Service:
    """The whole service in memory (see the module docstring for the attributes)."""

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

    # --- configuration reads ----------------------------------------------------------------

    def storelist(self) -> list[JSON]:
        return [render.store(s) for s in self.stores.values()]

    def packagelist(self) -> list[JSON]:
        return [render.package_type(p) for p in self.package_types.values()]

    def eft_memberships(self) -> list[JSON]:
        return [render.eft_type(t) for t in self.eft_types.values()]

    def noneft_memberships(self) -> list[JSON]:
        return [render.noneft_type(t) for t in self.noneft_types.values()]

    def eft_deduct_types(self) -> list[JSON]:
        return [{"code": c, "description": d} for c, d in self.deduct_types.items()]

    def eft_draw_days(self) -> list[JSON]:
        return [{"day": day, "description": d} for day, d in self.draw_days.items()]

    def skin_types(self) -> list[JSON]:
        return [{"code": c, "description": d} for c, d in self.skin_type_codes.items()]

    def webdocs(self) -> list[JSON]:
        return [{"docId": i, "name": n} for i, n in self.webdoc_names.items()]

    def profile_questions(self) -> list[JSON]:
        return [render.profile_question(q) for q in self.questions.values()]

    def payment_types(self, storecode: str) -> list[JSON]:
        store = self._store(storecode)
        return [render.payment_type(p) for p in self.store_payment_types[store.storecode]]

    def employees(self, storecode: str) -> list[JSON]:
        store = self._store(storecode)
        return [render.employee(e) for e in self.store_employees[store.storecode] if e.active]

    def products(self, storecode: str) -> list[JSON]:
        store = self._store(storecode)
        return [render.product(p) for p in self.store_products[store.storecode]]

    def processor_credentials(self, storecode: str, type: str) -> list[JSON]:
        store = self._store(storecode)
        if not type:
            raise missing("type")
        kind = type.upper()
        if len(type) != 3 or kind not in catalogue.CREDENTIAL_TYPES:
            raise bad("invalid_credentials_type", "type must be POS or EFT (3 characters)")
        return [
            render.processor_credentials(c)
            for c in self.credentials
            if c.storecode == store.storecode and c.type == kind
        ]

    # --- client reads -------------------------------------------------------------------------

    def clientdetails(self, client_number: str) -> JSON:
        return render.client(self._client(client_number, fill=False))

    def ledgerbalance(self, client_number: str) -> list[JSON]:
        client = self._client(client_number, fill=False)
        as_of = self.now().date().isoformat()
        salt = int(client.client_number) if client.client_number.isdigit() else 0
        return [
            {"storecode": code, "balance": render.money(balance, salt + i), "asOf": as_of}
            for i, (code, balance) in enumerate(client.ledger.items())
        ]

    def commprefs(self, client_number: str) -> JSON:
        return dict(self._client(client_number, fill=False).comm_prefs)

    def clientmemberships(self, client_number: str) -> list[JSON]:
        return [render.membership(ms) for ms in self._client(client_number).memberships]

    def clientpackages(self, client_number: str) -> list[JSON]:
        client = self._client(client_number)
        items = [render.client_package(p) for p in client.packages]
        for membership_id in sorted(self.shared_with.get(client.client_number, ())):
            self._membership(membership_id)  # fills the owner in
            package = self.affiliated[membership_id]
            items.append(render.client_package(package, shared_from=package.client_number))
        return items

    def pointsbalance(self, client_number: str) -> list[JSON]:
        client = self._client(client_number)
        return [{"storecode": code, "points": points} for code, points in client.points.items()]

    def getpointstransactions(
        self, client_number: str, start_date: dt.date | None, end_date: dt.date | None
    ) -> list[JSON]:
        client = self._client(client_number)
        if start_date is None:
            raise bad("missing_parameter", "startDate is required")
        if end_date is None:
            raise bad("missing_parameter", "endDate is required")
        _check_range(start_date, end_date)
        return [
            render.points_transaction(t)
            for t in client.points_transactions
            if start_date <= t.local_datetime.date() <= end_date
        ]

    def billinginfo(self, client_number: str) -> list[JSON]:
        return [render.billing_account(a) for a in self._client(client_number).billing_accounts]

    def transactionhistory(
        self, client_number: str, start_date: dt.date | None = None, end_date: dt.date | None = None
    ) -> list[JSON]:
        client = self._client(client_number)
        if start_date and end_date:
            _check_range(start_date, end_date)
        return [
            render.transaction(t, self._zones[t.storecode])
            for t in client.transactions
            if (start_date is None or t.local_datetime.date() >= start_date)
            and (end_date is None or t.local_datetime.date() <= end_date)
        ]

    def affiliatedpackageclients(self, membership_id: str) -> list[JSON]:
        self._membership(membership_id)
        return self._sharing(membership_id)

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

    def search(
        self,
        *,
        storecode: str | None = None,
        last_name: str | None = None,
        first_name: str | None = None,
        email: str | None = None,
        phone: str | None = None,
        modified_since: dt.datetime | None = None,
        page: int = 1,
        page_size: int = catalogue.DEFAULT_PAGE_SIZE,
    ) -> JSON:
        """Clients matching every criterion given, ordered by clientNumber, one page of them."""
        criteria = (
            storecode or None,
            last_name or None,
            first_name or None,
            email or None,
            phone or None,
            modified_since,
        )
        if all(c is None for c in criteria):
            raise bad(
                "missing_criterion",
                "search needs at least one criterion: storecode, lastName, firstName, email, phone "
                "or modifiedSince",
            )
        if criteria[0] is not None and len(criteria[0]) != 10:
            raise bad("invalid_storecode", "storecode must be exactly 10 characters")
        if not 1 <= page_size <= self.max_page_size:
            raise bad("invalid_page_size", f"pageSize must be between 1 and {self.max_page_size}")
        if page < 1:
            raise bad("invalid_page", "page must be 1 or more")
        numbers = self._matching(criteria)
        start = (page - 1) * page_size
        clients = self.clients
        items = [render.client_summary(clients[n]) for n in numbers[start : start + page_size]]
        return {"clients": items, "page": page, "pageSize": page_size, "totalCount": len(numbers)}

    def _matching(self, criteria: tuple[Any, ...]) -> list[str]:
        key = (self._version, *criteria)
        cached = self._search_cache.get(key)
        if cached is not None:
            return cached
        storecode, last_name, first_name, email, phone, since = criteria
        tests: list[Callable[[m.Client], bool]] = []
        if storecode is not None:
            tests.append(lambda c: c.home_store == storecode)
        if last_name is not None:
            ln = last_name.lower()
            tests.append(lambda c: c.last_name.lower().startswith(ln))
        if first_name is not None:
            fn = first_name.lower()
            tests.append(lambda c: c.first_name.lower().startswith(fn))
        if email is not None:
            em = email.lower()
            tests.append(lambda c: c.email.lower() == em)
        if phone is not None:
            digits = _digits(phone)
            tests.append(lambda c: _digits(c.phone) == digits)
        if since is not None:
            tests.append(lambda c: c.last_modified >= since)
        clients = self.clients
        if len(tests) == 1:
            only = tests[0]
            result = [n for n in self._sorted_numbers if only(clients[n])]
        else:
            result = [n for n in self._sorted_numbers if all(t(clients[n]) for t in tests)]
        if len(self._search_cache) > 64 or any(k[0] != self._version for k in self._search_cache):
            self._search_cache.clear()
        self._search_cache[key] = result
        return result

    # --- client writes -------------------------------------------------------------------------

    def insert_client(self, body: JSON) -> JSON:
        self._require(body, "insert_client")
        store = self._store(body["storecode"])
        self._employee(store, str(body["empNo"]))
        return {"clientNumber": self._new_client(body, store).client_number}

    def _new_client(self, body: JSON, store: m.Store) -> m.Client:
        birth = _date(body, "birthDate", required=False)
        skin = _text(body, "skinType", required=False)
        if skin is not None and skin.upper() not in self.skin_type_codes:
            raise invalid("skinType", "is not a skin type")
        referred_by = _text(body, "referredBy", required=False)
        if referred_by is not None:
            self._client(referred_by, "referredBy")
        stamp = self.now()
        last = self._sorted_numbers[-1] if self._sorted_numbers else "000000"
        number = str(int(last) + 1).zfill(len(last))
        client = m.Client(
            client_number=number,
            first_name=_text(body, "firstName", required=False) or "",
            last_name=_text(body, "lastName", required=False) or "",
            email=_text(body, "email", required=False) or "",
            phone=_text(body, "phone", required=False) or "",
            birth_date=birth,
            gender=_text(body, "gender", required=False) or "U",
            address1=_text(body, "address1", required=False) or "",
            city=_text(body, "city", required=False) or "",
            state=_text(body, "state", required=False) or "",
            postal_code=_text(body, "postalCode", required=False) or "",
            home_store=store.storecode,
            referred_by=referred_by,
            skin_type=skin.upper() if skin else None,
            created_date=self.local_now(store.storecode).date(),
            last_modified=stamp,
            comm_prefs={"email": True, "sms": False, "mail": False, "phone": False, "marketing": False},
        )
        self.add_client(client)
        return client

    def update_demographics(self, body: JSON) -> JSON:
        self._require(body, "update_demographics")
        client = self._client(body["clientNumber"])
        unknown = sorted(set(body) - set(DEMOGRAPHIC_FIELDS) - {"clientNumber"})
        if unknown:
            raise bad("unknown_field", f"{unknown[0]} is not a demographic field")
        changes: dict[str, Any] = {}
        for name, attr in DEMOGRAPHIC_FIELDS.items():
            if body.get(name) is None:
                continue  # only the fields passed are changed
            if name == "birthDate":
                changes[attr] = _date(body, name)
            elif name == "homeStore":
                changes[attr] = self._store(body[name], "homeStore").storecode
            elif name == "referredBy":
                changes[attr] = self._client(body[name], "referredBy").client_number
            elif name == "skinType":
                skin = _req_text(body, name).upper()
                if skin not in self.skin_type_codes:
                    raise invalid("skinType", "is not a skin type")
                changes[attr] = skin
            else:
                value = body[name]
                if not isinstance(value, str):
                    raise invalid(name, "must be a string")
                changes[attr] = value
        for attr, value in changes.items():
            setattr(client, attr, value)
        self.touch(client)
        return {"client": render.client(client)}

    def update_billing_info(self, body: JSON) -> JSON:
        self._require(body, "update_billing_info")
        client = self._client(body["clientNumber"])
        ms = self._membership_of(client, body["membershipId"])
        kind = _req_text(body, "type").upper()
        if kind not in catalogue.BILLING_TYPES:
            raise invalid("type", "must be CARD or CHECKING")
        deduct = _req_text(body, "deductType").upper()
        if deduct not in self.deduct_types:
            raise invalid("deductType", "is not an EFT deduct type")
        fields: dict[str, Any]
        if kind == "CARD":
            for name in ("lastFour", "expMonth", "expYear", "tokenId"):
                if not _given(body, name):
                    raise missing(name)
            last_four = str(body["lastFour"])
            if not re.fullmatch(r"\d{4}", last_four):
                raise invalid("lastFour", "must be 4 digits")
            month = _req_int(body, "expMonth")
            if not 1 <= month <= 12:
                raise invalid("expMonth", "must be between 1 and 12")
            year = _req_int(body, "expYear")
            if not 2000 <= year <= 2100:
                raise invalid("expYear", "must be a 4-digit year")
            fields = {
                "last_four": last_four,
                "exp_month": month,
                "exp_year": year,
                "token_id": _req_text(body, "tokenId"),
                "vault_token": _text(body, "vaultToken", required=False),
                "account_no": None,
                "routing_no": None,
            }
        else:
            for name in ("accountNo", "routingNo"):
                if not _given(body, name):
                    raise missing(name)
            account_no, routing_no = str(body["accountNo"]), str(body["routingNo"])
            if not re.fullmatch(r"\d{4,17}", account_no):
                raise invalid("accountNo", "must be 4 to 17 digits")
            if not re.fullmatch(r"\d{9}", routing_no):
                raise invalid("routingNo", "must be 9 digits")
            fields = {
                "last_four": None,
                "exp_month": None,
                "exp_year": None,
                "token_id": None,
                "vault_token": None,
                "account_no": account_no,
                "routing_no": routing_no,
            }
        account = next((a for a in client.billing_accounts if a.membership_id == ms.membership_id), None)
        if account is None:
            account = m.BillingAccount(
                self.next_id("billing", "BA{:06d}"), client.client_number, ms.membership_id, kind, deduct
            )
            self.add_billing_account(account)
        account.type, account.deduct_type = kind, deduct
        for attr, value in fields.items():
            setattr(account, attr, value)
        self.touch(client)
        return {"billingAccountId": account.billing_account_id}

    def insert_comment(self, body: JSON) -> JSON:
        self._require(body, "insert_comment")
        client = self._client(body["clientNumber"])
        emp_no = str(body["empNo"])
        if not any(e.emp_no == emp_no and e.active for emps in self.store_employees.values() for e in emps):
            raise invalid("empNo", f"{emp_no!r} is not an employee")
        comment = m.Comment(self.next_id("comment", "C{:07d}"), emp_no, _req_text(body, "text"), self.now())
        client.comments.append(comment)
        self.touch(client)
        return {"commentId": comment.comment_id}

    def insert_membership(self, body: JSON) -> JSON:
        self._require(body, "insert_membership")
        client = self._client(body["clientNumber"])
        store = self._store(body["storecode"])
        self._employee(store, str(body["empNo"]))
        is_eft = _bool(body, "isEft")
        type_id = str(body["membershipTypeId"])
        start = _date(body, "startDate", required=False) or self.local_now(store.storecode).date()
        on_hold = _bool(body, "onHold", default=False)
        draw_day: int | None = None
        dues: Decimal | None = None
        price: Decimal | None = None
        end: dt.date | None = None
        if is_eft:
            eft = self.eft_types.get(type_id)
            if eft is None:
                raise invalid("membershipTypeId", f"{type_id!r} is not an EFT membership")
            type_store, name, dues = eft.storecode, eft.name, eft.monthly_dues
            draw_day = _int(body, "drawDay")
            if draw_day not in self.draw_days:
                raise invalid("drawDay", "is not an EFT draw day")
        else:
            noneft = self.noneft_types.get(type_id)
            if noneft is None:
                raise invalid("membershipTypeId", f"{type_id!r} is not a non-EFT membership")
            type_store, name, price = noneft.storecode, noneft.name, noneft.price
            end = add_months(start, noneft.term_months)
        if type_store is not None and type_store != store.storecode:
            raise invalid("membershipTypeId", f"{type_id!r} is not sold at store {store.storecode!r}")
        stamp = self.touch(client)
        ms = m.Membership(
            membership_id=self.next_id("membership", "M{:07d}"),
            client_number=client.client_number,
            membership_type_id=type_id,
            name=name,
            is_eft=is_eft,
            status="OnHold" if on_hold else "Active",
            storecode=store.storecode,
            start_date=start,
            end_date=end,
            draw_day=draw_day,
            monthly_dues=dues,
            price=price,
            freeze_start_date=None,
            freeze_end_date=None,
            cancel_date=None,
            last_modified=stamp,
        )
        self.add_membership(ms)
        return {"membershipId": ms.membership_id}

    def insert_gift_cert(self, body: JSON) -> JSON:
        self._require(body, "insert_gift_cert")
        client = self._client(body["clientNumber"])
        store = self._store(body["storecode"])
        number = str(body["giftCertNo"])
        amount = _money(body, "amount", positive=True)
        if number in self.gift_certs:
            raise conflict("gift_cert_exists", f"giftCertNo {number!r} already exists")
        self.gift_certs[number] = m.GiftCert(number, client.client_number, store.storecode, amount)
        self.touch(client)
        return {"giftCertNo": number}

    # membership state machine (contract section 4)

    def _transition(self, body: JSON, endpoint_name: str, need: str, eft_only: bool) -> m.Membership:
        self._require(body, endpoint_name)
        client = self._client(body["clientNumber"])
        ms = self._membership_of(client, body["membershipId"])
        if ms.status.lower() != need.lower() or (eft_only and not ms.is_eft):
            what = f"an {need} EFT membership" if eft_only else f"an {need} membership"
            now = f"{ms.status} ({'EFT' if ms.is_eft else 'non-EFT'})"
            raise conflict(
                "invalid_state",
                f"membershipId {ms.membership_id!r} is {now}; {endpoint_name} needs {what}",
            )
        return ms

    def _changed(self, client_number: str, ms: m.Membership) -> JSON:
        ms.last_modified = self.touch(self.clients[client_number])
        return {"membership": render.membership(ms)}

    def freeze_membership(self, body: JSON) -> JSON:
        ms = self._transition(body, "freeze_membership", "Active", eft_only=True)
        start = _date(body, "freezeStartDate")
        end = _date(body, "freezeEndDate", required=False)
        assert start is not None
        if end is not None and end < start:
            raise invalid("freezeEndDate", "must not be before freezeStartDate")
        ms.status, ms.freeze_start_date, ms.freeze_end_date = "Frozen", start, end
        return self._changed(ms.client_number, ms)

    def unfreeze_membership(self, body: JSON) -> JSON:
        ms = self._transition(body, "unfreeze_membership", "Frozen", eft_only=True)
        ms.status, ms.freeze_start_date, ms.freeze_end_date = "Active", None, None
        return self._changed(ms.client_number, ms)

    def activate_membership(self, body: JSON) -> JSON:
        ms = self._transition(body, "activate_membership", "OnHold", eft_only=False)
        ms.status = "Active"
        return self._changed(ms.client_number, ms)

    def upgrade_membership(self, body: JSON) -> JSON:
        return self._change_type(body, "upgrade_membership", up=True)

    def downgrade_membership(self, body: JSON) -> JSON:
        return self._change_type(body, "downgrade_membership", up=False)

    def _change_type(self, body: JSON, endpoint_name: str, up: bool) -> JSON:
        ms = self._transition(body, endpoint_name, "Active", eft_only=True)
        new_id = str(body["newMembershipTypeId"])
        new = self.eft_types.get(new_id)
        if new is None:
            raise invalid("newMembershipTypeId", f"{new_id!r} is not an EFT membership")
        old = ms.monthly_dues or m.ZERO
        if up and new.monthly_dues <= old:
            raise bad("not_an_upgrade", f"newMembershipTypeId {new_id!r} must cost more than the current one")
        if not up and new.monthly_dues >= old:
            raise bad(
                "not_a_downgrade", f"newMembershipTypeId {new_id!r} must cost less than the current one"
            )
        ms.membership_type_id, ms.name, ms.monthly_dues = new.membership_type_id, new.name, new.monthly_dues
        return self._changed(ms.client_number, ms)

    def cancel_membership(self, body: JSON) -> JSON:
        ms = self._transition(body, "cancel_membership", "Active", eft_only=True)
        day = _date(body, "cancelDate", required=False) or self.local_now(ms.storecode).date()
        ms.status, ms.cancel_date, ms.end_date = "Canceled", day, day
        return self._changed(ms.client_number, ms)

    # money

    def post_account_ledger_payment(self, body: JSON) -> JSON:
        self._require(body, "post_account_ledger_payment")
        client = self._client(body["clientNumber"])
        store = self._store(body["storecode"])
        amount = _money(body, "amount", positive=True)
        self._payment_type(store, str(body["paymentType"]))
        balance = client.ledger.get(store.storecode, m.ZERO) - amount
        client.ledger[store.storecode] = balance
        self.touch(client)
        return {"balance": render.money(balance, 1)}

    def insert_points(self, body: JSON) -> JSON:
        self._require(body, "insert_points")
        client = self._client(body["clientNumber"])
        store = self._store(body["storecode"])
        points = _req_int(body, "points")
        if points == 0:
            raise invalid("points", "must not be 0")
        reason = _req_text(body, "reason")
        balance = client.points.get(store.storecode, 0)
        if balance + points < 0:
            raise conflict("insufficient_points", f"points: the balance at {store.storecode!r} is {balance}")
        client.points[store.storecode] = balance + points
        txn = m.PointsTransaction(
            self.next_id("points", "PT{:07d}"),
            client.client_number,
            self.local_now(store.storecode),
            store.storecode,
            points,
            reason,
            _text(body, "receiptNumber", required=False),
        )
        client.points_transactions.append(txn)
        self.touch(client)
        return {"pointsTransactionId": txn.points_transaction_id}

    def update_comm_prefs(self, body: JSON) -> JSON:
        self._require(body, "update_comm_prefs")
        client = self._client(body["clientNumber"])
        changes = {name: _bool(body, name) for name in COMM_PREFS if body.get(name) is not None}
        client.comm_prefs.update(changes)
        self.touch(client)
        return {"preferences": dict(client.comm_prefs)}

    def insert_transaction(self, body: JSON) -> JSON:
        self._require(body, "insert_transaction")
        client = self._client(body["clientNumber"])
        store = self._store(body["storecode"])
        emp = self._employee(store, str(body["empNo"]))
        raw_lines = body["lines"]
        if not isinstance(raw_lines, list) or not raw_lines:
            raise invalid("lines", "must be a non-empty array")
        lines = [self._line(client, store, raw, i) for i, raw in enumerate(raw_lines)]
        when = self.local_now(store.storecode)
        txn = m.Transaction(
            self.next_id("receipt", "{:08d}"),
            client.client_number,
            store.storecode,
            emp.emp_no,
            when,
            "Saved",
            lines,
            [],
        )
        self.add_transaction(txn)
        client.ledger[store.storecode] = client.ledger.get(store.storecode, m.ZERO) + txn.total
        for line in lines:
            if line.type == "P":  # a package sale gives the client the package
                self._give_package(client, store, self.package_types[line.ref], line.quantity, when.date())
        self.touch(client)
        return {"receiptNumber": txn.receipt_number}

    def _line(self, client: m.Client, store: m.Store, raw: object, i: int) -> m.TransactionLine:
        where = f"lines[{i}]"
        if not isinstance(raw, dict):
            raise invalid(where, "must be an object")
        kind = raw.get("type")
        if kind is None or kind == "":
            raise missing(f"{where}.type")
        kind = str(kind).upper()
        if kind not in catalogue.TRANSACTION_TYPES:
            raise invalid(f"{where}.type", "must be one of R, P, M, 1, G")
        field = catalogue.LINE_REQUIRED_FIELD[kind]
        if not _given(raw, field):
            raise missing(f"{where}.{field}")
        ref = str(raw[field])
        if kind == "R":
            product = next((p for p in self.store_products[store.storecode] if p.product_number == ref), None)
            if product is None:
                raise invalid(f"{where}.productNumber", f"{ref!r} is not a product of the store")
            description = product.name
        elif kind == "P":
            if ref not in self.package_types:
                raise invalid(f"{where}.packageId", f"{ref!r} is not a package")
            description = self.package_types[ref].name
        elif kind in ("M", "1"):
            ms = self._membership_of(client, ref)
            description = ms.name if kind == "M" else f"{ms.name} fee"
        else:
            description = f"Gift certificate {ref}"
        quantity = _int(raw, "quantity", required=False)
        quantity = 1 if quantity is None else quantity
        if quantity < 1:
            raise invalid(f"{where}.quantity", "must be 1 or more")
        if not _given(raw, "pricePerUnit"):
            raise missing(f"{where}.pricePerUnit")
        price = parse_money(raw["pricePerUnit"], f"{where}.pricePerUnit")
        tax = parse_money(raw["tax"], f"{where}.tax") if _given(raw, "tax") else m.ZERO
        if price < 0 or tax < 0:
            raise invalid(f"{where}.pricePerUnit" if price < 0 else f"{where}.tax", "must not be negative")
        description = str(raw.get("description") or description)
        return m.TransactionLine(i + 1, kind, ref, description, quantity, price, price * quantity, tax)

    def _give_package(
        self, client: m.Client, store: m.Store, ptype: m.PackageType, quantity: int, day: dt.date
    ) -> None:
        sessions = ptype.sessions * quantity
        client.packages.append(
            m.ClientPackage(
                self.next_id("client_package", "CP{:07d}"),
                client.client_number,
                ptype.package_id,
                ptype.name,
                store.storecode,
                day,
                add_months(day, 12),
                sessions,
                sessions,
            )
        )

    def insert_payment(self, body: JSON) -> JSON:
        self._require(body, "insert_payment")
        number = body["receiptNumber"]
        txn = self._transaction(number)
        store = self.stores[txn.storecode]
        ptype = self._payment_type(store, str(body["paymentType"]))
        amount = _money(body, "amount", positive=True)
        if txn.voided:
            raise conflict("transaction_voided", f"receiptNumber {number!r} is voided")
        payment = m.Payment(
            self.next_id("payment", "PY{:07d}"), ptype.code, amount, self.local_now(store.storecode)
        )
        txn.payments.append(payment)
        client = self.clients[txn.client_number]
        client.ledger[store.storecode] = client.ledger.get(store.storecode, m.ZERO) - amount
        self.touch(client)
        return {"paymentId": payment.payment_id}

    # sharing

    def share_affiliated_package(self, body: JSON) -> JSON:
        ms, sharee = self._share_parties(body, "share_affiliated_package")
        if sharee.client_number == ms.client_number:
            raise conflict("invalid_state", "clientNumber is the owner of the package: it cannot share it")
        if sharee.client_number in self.shares.get(ms.membership_id, {}):
            raise conflict("already_shared", f"membershipId {ms.membership_id!r} is already shared with it")
        self.share(ms.membership_id, sharee.client_number, self.local_now(ms.storecode).date())
        self.touch(sharee, self.clients[ms.client_number])
        return {"clients": self._sharing(ms.membership_id)}

    def unshare_affiliated_package(self, body: JSON) -> JSON:
        ms, sharee = self._share_parties(body, "unshare_affiliated_package")
        shared = self.shares.get(ms.membership_id, {})
        if sharee.client_number not in shared:
            raise conflict("not_shared", f"membershipId {ms.membership_id!r} is not shared with clientNumber")
        del shared[sharee.client_number]
        self.shared_with[sharee.client_number].discard(ms.membership_id)
        self.touch(sharee, self.clients[ms.client_number])
        return {"clients": self._sharing(ms.membership_id)}

    def _share_parties(self, body: JSON, endpoint_name: str) -> tuple[m.Membership, m.Client]:
        self._require(body, endpoint_name)
        ms = self._membership(body["membershipId"])
        sharee = self._client(body["clientNumber"])
        if ms.membership_id not in self.affiliated:
            raise conflict(
                "not_affiliated", f"membershipId {ms.membership_id!r} carries no affiliated package"
            )
        return ms, sharee

    # other client writes

    def insert_profile_answers(self, body: JSON) -> JSON:
        self._require(body, "insert_profile_answers")
        client = self._client(body["clientNumber"])
        answers = body["answers"]
        if not isinstance(answers, list) or not answers:
            raise invalid("answers", "must be a non-empty array")
        parsed: dict[str, object] = {}
        for i, raw in enumerate(answers):
            where = f"answers[{i}]"
            if not isinstance(raw, dict):
                raise invalid(where, "must be an object")
            qid = _text(raw, "questionId")
            question = self.questions.get(str(qid))
            if question is None:
                raise invalid(f"{where}.questionId", f"{qid!r} is not a profile question")
            if raw.get("answer") is None:
                raise missing(f"{where}.answer")
            answer = raw["answer"]
            if question.answer_type == "CHOICE" and answer not in question.choices:
                raise invalid(f"{where}.answer", f"must be one of {question.choices}")
            if question.answer_type == "YESNO" and not (
                isinstance(answer, bool) or str(answer).upper() in ("YES", "NO", "Y", "N")
            ):
                raise invalid(f"{where}.answer", "must be yes or no")
            parsed[question.question_id] = answer
        client.profile_answers.update(parsed)
        self.touch(client)
        return {"count": len(parsed)}

    def add_referral(self, body: JSON) -> JSON:
        self._require(body, "add_referral")
        client = self._client(body["clientNumber"])
        referred = self._client(body["referredClientNumber"], "referredClientNumber")
        if referred is client:
            raise invalid("referredClientNumber", "must not be the client itself")
        referral = m.Referral(
            self.next_id("referral", "RF{:06d}"), client.client_number, referred.client_number
        )
        self.referrals.append(referral)
        referred.referred_by = client.client_number
        self.touch(client, referred)
        return {"referralId": referral.referral_id}

    def generate_web_document(self, body: JSON) -> JSON:
        self._require(body, "generate_web_document")
        client = self._client(body["clientNumber"])
        doc_id = str(body["docId"])
        if doc_id not in self.webdoc_names:
            raise invalid("docId", f"{doc_id!r} is not a web document")
        token = hashlib.sha256(f"{doc_id}:{client.client_number}:{self.now()}".encode()).hexdigest()[:24]
        return {
            "url": f"https://docs.sandbox.invalid/webdocs/{doc_id}?client={client.client_number}&t={token}"
        }

    # --- user writes ---------------------------------------------------------------------------

    def register_user(self, body: JSON) -> JSON:
        self._require(body, "register_user")
        username = _req_text(body, "username")
        password = body["password"]
        _check_password(password, "password")
        store = self._store(body["storecode"])
        if username.lower() in (u.lower() for u in self.users):
            raise conflict("username_taken", f"username {username!r} is taken")
        client = self._new_client(body, store)
        salt = os.urandom(16)
        self.users[username] = m.User(username, client.client_number, salt, hash_password(password, salt))
        return {
            "clientNumber": client.client_number,
            "user": {"username": username, "clientNumber": client.client_number},
        }

    def reset_password(self, body: JSON) -> JSON:
        self._require(body, "reset_password")
        username = _req_text(body, "username")
        user = self.users.get(username)
        if user is None:
            raise not_found("username", username)
        _check_password(body["newPassword"], "newPassword")
        user.salt = os.urandom(16)
        user.password_hash = hash_password(body["newPassword"], user.salt)
        return {"reset": True}

    def login(self, body: JSON) -> JSON:
        self._require(body, "login")
        username = _req_text(body, "username")
        password = body["password"]
        if not isinstance(password, str):
            raise invalid("password", "must be a string")
        user = self.users.get(username)
        # Hash even for an unknown user, so timing does not tell which usernames exist.
        digest = hash_password(password, user.salt if user else self._dummy_salt)
        if user is None or not hmac.compare_digest(digest, user.password_hash):
            return {"valid": False, "clientNumber": None}
        user.logins.append(self.now())
        return {"valid": True, "clientNumber": user.client_number}

    # --- helpers for tests and reports -----------------------------------------------------------

    def iter_clients(self) -> Iterable[m.Client]:
        """Every client in clientNumber order, holdings filled in."""
        return (self.fill(self.clients[n]) for n in self._sorted_numbers)


def _check_range(start: dt.date, end: dt.date) -> None:
    if end < start:
        raise bad("invalid_date_range", "endDate must not be before startDate")


def _check_password(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    if len(value) < MIN_PASSWORD:
        raise invalid(name, f"must be at least {MIN_PASSWORD} characters")


def _digits(value: str) -> str:
    return "".join(ch for ch in value if ch.isdigit())
