"""The writes of the sandbox's service: client writes (demographics, billing, memberships and
their state machine, money, sharing, ...) and user writes.

Each write takes the request body (a dict with the contract's logical field names), checks it
(400, 404 or 409 naming the field), changes the state, stamps the clients it changed and answers
the contract's JSON.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
from decimal import Decimal
from typing import Any

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox import render
from membersync.extract.sandbox.core import ServiceCore
from membersync.extract.sandbox.validation import (
    JSON,
    _bool,
    _check_password,
    _date,
    _given,
    _int,
    _money,
    _req_int,
    _req_text,
    _text,
    add_months,
    bad,
    conflict,
    hash_password,
    invalid,
    missing,
    not_found,
    parse_money,
)

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


class Writes(ServiceCore):
    """The write endpoints, one method each."""

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
        fields = _card_fields(body) if kind == "CARD" else _checking_fields(body)
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
        # Only a redemption can be refused for want of points: an earning on an overdrawn balance
        # (a refunded sale's points already spent) is accepted and reduces the overdraft.
        if points < 0 and balance + points < 0:
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


# The billing account's fields from an update_billing_info body, by type. Every field of the
# other type is set to None: an account switched from card to checking keeps no card detail.


def _card_fields(body: JSON) -> dict[str, Any]:
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
    return {
        "last_four": last_four,
        "exp_month": month,
        "exp_year": year,
        "token_id": _req_text(body, "tokenId"),
        "vault_token": _text(body, "vaultToken", required=False),
        "account_no": None,
        "routing_no": None,
    }


def _checking_fields(body: JSON) -> dict[str, Any]:
    for name in ("accountNo", "routingNo"):
        if not _given(body, name):
            raise missing(name)
    account_no, routing_no = str(body["accountNo"]), str(body["routingNo"])
    if not re.fullmatch(r"\d{4,17}", account_no):
        raise invalid("accountNo", "must be 4 to 17 digits")
    if not re.fullmatch(r"\d{9}", routing_no):
        raise invalid("routingNo", "must be 9 digits")
    return {
        "last_four": None,
        "exp_month": None,
        "exp_year": None,
        "token_id": None,
        "vault_token": None,
        "account_no": account_no,
        "routing_no": routing_no,
    }
