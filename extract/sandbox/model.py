"""The sandbox's domain records: what the service knows, in Python types.

These are the ground truth tests compute expected results from. Money is ``Decimal`` with
exactly two decimals; dates are ``datetime.date``; store-local datetimes are *naive*
``datetime`` values in the store's timezone (the canonical instant; the wire may show it
with an offset or as UTC); ``last_modified`` values are timezone-aware UTC datetimes with
whole seconds. Ids are opaque strings.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

CENT = Decimal("0.01")
ZERO = Decimal("0.00")

WireStyle = Literal["local", "offset", "utc"]


def cents(value: int) -> Decimal:
    """``Decimal`` with two decimals from a whole number of cents (4250 -> 42.50)."""
    return Decimal(value).scaleb(-2)


# --- configuration ---------------------------------------------------------------------------


@dataclass(slots=True)
class Store:
    storecode: str  # exactly 10 characters, may end in spaces ("DOWNTOWN  ")
    name: str
    city: str
    state: str
    timezone: str  # IANA name
    active: bool
    tax_rate: Decimal  # sales tax applied to generated retail lines (not on the wire)


@dataclass(slots=True)
class PackageType:
    package_id: str
    name: str
    price: Decimal
    sessions: int
    affiliated: bool  # can be shared through an affiliated membership
    storecode: str | None  # None = sold at every store


@dataclass(slots=True)
class EftMembershipType:
    membership_type_id: str
    name: str
    monthly_dues: Decimal
    enrollment_fee: Decimal
    storecode: str | None


@dataclass(slots=True)
class NonEftMembershipType:
    membership_type_id: str
    name: str
    price: Decimal
    term_months: int
    storecode: str | None


@dataclass(slots=True)
class PaymentType:
    code: str
    description: str
    kind: str  # CASH, CARD, CHECK, GIFT, ACCOUNT, OTHER


@dataclass(slots=True)
class Employee:
    emp_no: str
    first_name: str
    last_name: str
    storecode: str
    role: str
    active: bool = True


@dataclass(slots=True)
class Product:
    product_number: str
    name: str
    price: Decimal
    category: str
    storecode: str


@dataclass(slots=True)
class ProcessorCredentials:
    storecode: str
    type: str  # POS or EFT
    processor: str
    merchant_id: str
    username: str  # secret
    password: str  # secret
    api_key: str  # secret


@dataclass(slots=True)
class ProfileQuestion:
    question_id: str
    text: str
    answer_type: str  # TEXT, CHOICE, YESNO
    choices: list[str]


# --- clients and what they hold ---------------------------------------------------------------


@dataclass(slots=True)
class Membership:
    membership_id: str
    client_number: str
    membership_type_id: str
    name: str
    is_eft: bool
    status: str  # Active, Frozen, OnHold, Canceled, Expired
    storecode: str
    start_date: dt.date
    end_date: dt.date | None
    draw_day: int | None  # EFT only
    monthly_dues: Decimal | None  # EFT only
    price: Decimal | None  # non-EFT only
    freeze_start_date: dt.date | None
    freeze_end_date: dt.date | None
    cancel_date: dt.date | None
    last_modified: dt.datetime


@dataclass(slots=True)
class ClientPackage:
    client_package_id: str
    client_number: str  # the owner (sharees see it with sharedFromClientNumber = owner)
    package_id: str
    name: str
    storecode: str
    purchase_date: dt.date
    expiration_date: dt.date | None
    sessions_total: int
    sessions_remaining: int
    membership_id: str | None = None  # the owner's membership it is shared through (affiliated)


@dataclass(slots=True)
class PointsTransaction:
    points_transaction_id: str
    client_number: str
    local_datetime: dt.datetime  # naive, store time
    storecode: str
    points: int  # > 0 earned, < 0 redeemed
    reason: str
    receipt_number: str | None


@dataclass(slots=True)
class TransactionLine:
    line_no: int
    type: str  # R, P, M, 1, G
    ref: str  # the value of the field its type requires (catalogue.LINE_REQUIRED_FIELD)
    description: str
    quantity: int
    price_per_unit: Decimal
    amount: Decimal  # quantity * price_per_unit, before tax
    tax: Decimal


@dataclass(slots=True)
class Payment:
    payment_id: str
    payment_type: str
    amount: Decimal
    local_datetime: dt.datetime  # naive, store time


@dataclass(slots=True)
class Transaction:
    receipt_number: str
    client_number: str
    storecode: str
    emp_no: str
    local_datetime: dt.datetime  # canonical naive store-local datetime
    status: str  # Saved or Voided, in any case (the contract compares enumerations so)
    lines: list[TransactionLine]
    payments: list[Payment]
    wire_style: WireStyle = "local"  # how transactionDate is written on the wire

    @property
    def voided(self) -> bool:
        return self.status.lower() == "voided"

    @property
    def subtotal(self) -> Decimal:
        return sum((line.amount for line in self.lines), ZERO)

    @property
    def tax(self) -> Decimal:
        return sum((line.tax for line in self.lines), ZERO)

    @property
    def total(self) -> Decimal:
        """Amounts plus tax: what the transaction adds to the ledger at its store."""
        return self.subtotal + self.tax

    @property
    def paid(self) -> Decimal:
        return sum((p.amount for p in self.payments), ZERO)


@dataclass(slots=True)
class BillingAccount:
    billing_account_id: str
    client_number: str
    membership_id: str
    type: str  # CARD or CHECKING
    deduct_type: str
    last_four: str | None = None
    exp_month: int | None = None
    exp_year: int | None = None
    token_id: str | None = None  # secret
    vault_token: str | None = None  # secret
    account_no: str | None = None  # secret
    routing_no: str | None = None  # secret


@dataclass(slots=True)
class Comment:
    comment_id: str
    emp_no: str
    text: str
    created: dt.datetime


@dataclass(slots=True)
class GiftCert:
    gift_cert_no: str
    client_number: str
    storecode: str
    amount: Decimal


@dataclass(slots=True)
class Referral:
    referral_id: str
    client_number: str
    referred_client_number: str


@dataclass(slots=True)
class User:
    username: str
    client_number: str
    salt: bytes
    password_hash: bytes  # scrypt(password, salt); the password itself is never stored
    logins: list[dt.datetime] = field(default_factory=list)


@dataclass(slots=True)
class Client:
    client_number: str  # digits, may have leading zeros
    first_name: str
    last_name: str
    email: str
    phone: str
    birth_date: dt.date | None
    gender: str
    address1: str
    city: str
    state: str
    postal_code: str
    home_store: str
    referred_by: str | None
    skin_type: str | None
    created_date: dt.date
    last_modified: dt.datetime  # aware UTC, whole seconds
    comm_prefs: dict[str, bool] = field(default_factory=dict)  # email, sms, mail, phone, marketing
    ledger: dict[str, Decimal] = field(default_factory=dict)  # storecode -> balance (+ owed, - credit)
    points: dict[str, int] = field(default_factory=dict)  # storecode -> points balance
    memberships: list[Membership] = field(default_factory=list)
    packages: list[ClientPackage] = field(default_factory=list)  # owned (not those shared with it)
    transactions: list[Transaction] = field(default_factory=list)
    points_transactions: list[PointsTransaction] = field(default_factory=list)
    billing_accounts: list[BillingAccount] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)
    profile_answers: dict[str, object] = field(default_factory=dict)
    # False while the generator has not yet filled in what the client holds (memberships, packages,
    # transactions, points, billing accounts): see ``Service.fill``. Clients made by writes are whole.
    filled: bool = True
