"""Domain records -> the contract's JSON items (logical field names, JSON-ready values).

Money goes out sometimes as a JSON number, sometimes as a numeric string (the contract allows
both, and a client must cope): the choice is a deterministic function of a salt (the item's
sequence number), so the same data always renders the same way. Transaction datetimes go out
in the style the transaction carries (store-local without offset, with an offset, or as UTC
``Z``): the same instant either way.
"""

from __future__ import annotations

import datetime as dt
import zlib
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from membersync.extract.catalogue import LINE_REQUIRED_FIELD
from membersync.extract.sandbox import model as m

UTC = dt.UTC
JSON = dict[str, Any]


def money(value: Decimal | None, salt: int) -> float | str | None:
    """A 2-decimal Decimal as a JSON number (2 of 3 times) or a numeric string."""
    if value is None:
        return None
    if salt % 3 == 0:
        return str(value)
    return float(value)  # the shortest repr of a 2-decimal float is that decimal: exact on the wire


def date(value: dt.date | None) -> str | None:
    return None if value is None else value.isoformat()


def local(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S")


def utc(value: dt.datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ`` (isoformat is several times faster than strftime)."""
    if value.utcoffset() != dt.timedelta(0):
        value = value.astimezone(UTC)
    return value.isoformat(timespec="seconds")[:19] + "Z"


def styled(value: dt.datetime, style: m.WireStyle, zone: ZoneInfo) -> str:
    """A store-local datetime in one of the wire styles (same instant)."""
    if style == "local":
        return local(value)
    aware = value.replace(tzinfo=zone)
    if style == "offset":
        return aware.isoformat(timespec="seconds")
    return utc(aware)


def _salt(ident: str) -> int:
    """A stable number from an id (``hash()`` of a str changes between processes)."""
    return zlib.crc32(ident.encode())


# --- configuration ---------------------------------------------------------------------------


def store(s: m.Store) -> JSON:
    return {
        "storecode": s.storecode,
        "name": s.name,
        "city": s.city,
        "state": s.state,
        "timezone": s.timezone,
        "active": s.active,
    }


def package_type(p: m.PackageType) -> JSON:
    return {
        "packageId": p.package_id,
        "name": p.name,
        "price": money(p.price, _salt(p.package_id)),
        "sessions": p.sessions,
        "affiliated": p.affiliated,
        "storecode": p.storecode,
    }


def eft_type(t: m.EftMembershipType) -> JSON:
    salt = _salt(t.membership_type_id)
    return {
        "membershipTypeId": t.membership_type_id,
        "name": t.name,
        "monthlyDues": money(t.monthly_dues, salt),
        "enrollmentFee": money(t.enrollment_fee, salt + 1),
        "storecode": t.storecode,
    }


def noneft_type(t: m.NonEftMembershipType) -> JSON:
    return {
        "membershipTypeId": t.membership_type_id,
        "name": t.name,
        "price": money(t.price, _salt(t.membership_type_id)),
        "termMonths": t.term_months,
        "storecode": t.storecode,
    }


def payment_type(p: m.PaymentType) -> JSON:
    return {"code": p.code, "description": p.description, "kind": p.kind}


def employee(e: m.Employee) -> JSON:
    return {
        "empNo": e.emp_no,
        "firstName": e.first_name,
        "lastName": e.last_name,
        "storecode": e.storecode,
        "role": e.role,
    }


def product(p: m.Product) -> JSON:
    return {
        "productNumber": p.product_number,
        "name": p.name,
        "price": money(p.price, _salt(p.product_number)),
        "category": p.category,
        "storecode": p.storecode,
    }


def processor_credentials(c: m.ProcessorCredentials) -> JSON:
    return {
        "processor": c.processor,
        "merchantId": c.merchant_id,
        "username": c.username,
        "password": c.password,
        "apiKey": c.api_key,
    }


def profile_question(q: m.ProfileQuestion) -> JSON:
    return {"questionId": q.question_id, "text": q.text, "answerType": q.answer_type, "choices": q.choices}


# --- clients ------------------------------------------------------------------------------------


def client_summary(c: m.Client) -> JSON:
    return {
        "clientNumber": c.client_number,
        "firstName": c.first_name,
        "lastName": c.last_name,
        "email": c.email,
        "homeStore": c.home_store,
        "lastModified": utc(c.last_modified),
    }


def client(c: m.Client) -> JSON:
    return {
        "clientNumber": c.client_number,
        "firstName": c.first_name,
        "lastName": c.last_name,
        "email": c.email,
        "phone": c.phone,
        "birthDate": date(c.birth_date),
        "gender": c.gender,
        "address1": c.address1,
        "city": c.city,
        "state": c.state,
        "postalCode": c.postal_code,
        "homeStore": c.home_store,
        "referredBy": c.referred_by,
        "skinType": c.skin_type,
        "createdDate": date(c.created_date),
        "lastModified": utc(c.last_modified),
    }


def membership(ms: m.Membership) -> JSON:
    salt = _salt(ms.membership_id)
    return {
        "membershipId": ms.membership_id,
        "membershipTypeId": ms.membership_type_id,
        "name": ms.name,
        "isEft": ms.is_eft,
        "status": ms.status,
        "storecode": ms.storecode,
        "startDate": date(ms.start_date),
        "endDate": date(ms.end_date),
        "drawDay": ms.draw_day,
        "monthlyDues": money(ms.monthly_dues, salt),
        "price": money(ms.price, salt),
        "freezeStartDate": date(ms.freeze_start_date),
        "freezeEndDate": date(ms.freeze_end_date),
        "cancelDate": date(ms.cancel_date),
        "lastModified": utc(ms.last_modified),
    }


def client_package(p: m.ClientPackage, shared_from: str | None = None) -> JSON:
    return {
        "clientPackageId": p.client_package_id,
        "packageId": p.package_id,
        "name": p.name,
        "storecode": p.storecode,
        "purchaseDate": date(p.purchase_date),
        "expirationDate": date(p.expiration_date),
        "sessionsTotal": p.sessions_total,
        "sessionsRemaining": p.sessions_remaining,
        "sharedFromClientNumber": shared_from,
    }


def points_transaction(t: m.PointsTransaction) -> JSON:
    return {
        "pointsTransactionId": t.points_transaction_id,
        "date": local(t.local_datetime),
        "storecode": t.storecode,
        "points": t.points,
        "reason": t.reason,
        "receiptNumber": t.receipt_number,
    }


def billing_account(a: m.BillingAccount) -> JSON:
    return {
        "billingAccountId": a.billing_account_id,
        "membershipId": a.membership_id,
        "type": a.type,
        "deductType": a.deduct_type,
        "lastFour": a.last_four,
        "expMonth": a.exp_month,
        "expYear": a.exp_year,
        "tokenId": a.token_id,
        "vaultToken": a.vault_token,
        "accountNo": a.account_no,
        "routingNo": a.routing_no,
    }


def transaction(t: m.Transaction, zone: ZoneInfo) -> JSON:
    salt = _salt(t.receipt_number)
    return {
        "receiptNumber": t.receipt_number,
        "transactionDate": styled(t.local_datetime, t.wire_style, zone),
        "storecode": t.storecode,
        "empNo": t.emp_no,
        "status": t.status,
        "lines": [_line(line, salt + i) for i, line in enumerate(t.lines)],
        "payments": [_payment(p, salt + i, t.wire_style, zone) for i, p in enumerate(t.payments)],
    }


def _line(line: m.TransactionLine, salt: int) -> JSON:
    return {
        "lineNo": line.line_no,
        "type": line.type,
        LINE_REQUIRED_FIELD[line.type]: line.ref,
        "description": line.description,
        "quantity": line.quantity,
        "pricePerUnit": money(line.price_per_unit, salt),
        "amount": money(line.amount, salt + 1),
        "tax": money(line.tax, salt + 2),
    }


def _payment(p: m.Payment, salt: int, style: m.WireStyle, zone: ZoneInfo) -> JSON:
    return {
        "paymentId": p.payment_id,
        "paymentType": p.payment_type,
        "amount": money(p.amount, salt),
        "date": styled(p.local_datetime, style, zone),
    }
