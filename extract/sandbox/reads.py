"""The reads of the sandbox's service: configuration, clients and the client search.

Each read takes typed arguments (snake_case of the logical query parameters) and answers the
contract's JSON or raises :class:`~.validation.ApiError`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox import render
from membersync.extract.sandbox.core import ServiceCore
from membersync.extract.sandbox.validation import JSON, _check_range, _digits, bad, missing


class Reads(ServiceCore):
    """The read endpoints, one method each."""

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

    # --- search ------------------------------------------------------------------------------

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
