"""The catalogue of the service's endpoints, declared once.

Every endpoint of ``service-interface-v2.md`` is one :class:`Endpoint` here. The client
builds its typed methods' requests from it, the sandbox routes from it, and the sync
lands what it answers into the table it names. Names are *logical* (the contract's); the
tenant profile (:mod:`membersync.extract.profile`) maps them to the names a tenant's
server actually uses on the wire.

Kinds of endpoint:

- ``config``: configuration list, ``GET``, answers ``{wrapper: [items]}``.
- ``store``: configuration list scoped by ``storecode`` (and ``type`` for processor
  credentials), ``GET``, answers ``{wrapper: [items]}``.
- ``client_read``: client-scoped ``GET``; answers ``{wrapper: [items]}`` (``shape="list"``)
  or ``{wrapper: {object}}`` (``shape="object"``).
- ``search``: the paged ``clients/search``.
- ``client_write`` / ``user_write``: ``POST`` with a JSON body; answers an object whose
  ``answer`` fields are always present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["config", "store", "client_read", "search", "client_write", "user_write"]
Shape = Literal["list", "object", "answer"]

PREFIX = "/svcapi/"


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter (logical name) of a GET endpoint."""

    name: str
    required: bool = True
    kind: Literal["str", "date", "datetime", "int", "storecode", "credtype"] = "str"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of the service.

    ``name`` is the logical name (also the client's method name and the profile's key);
    ``path`` is relative to ``{base_url}`` and starts with ``/svcapi/``; ``wrapper`` is the
    default key that wraps the answer (overridable per tenant for client and user
    endpoints); ``record`` names the record type of the items (the profile's field maps and
    the landing schemas are keyed by it); ``answer`` lists the fields a write's answer
    always carries; ``required`` lists the body fields a write requires (type-specific rules
    live with the sandbox's validators).
    """

    name: str
    method: Literal["GET", "POST"]
    path: str
    kind: Kind
    shape: Shape
    wrapper: str | None = None
    record: str | None = None
    params: tuple[Param, ...] = ()
    required: tuple[str, ...] = ()
    answer: tuple[str, ...] = ()

    @property
    def is_write(self) -> bool:
        return self.method == "POST"


STORECODE = Param("storecode", kind="storecode")
CLIENT_NUMBER = Param("clientNumber")


def _config(name: str, path: str, wrapper: str, record: str, *params: Param) -> Endpoint:
    kind: Kind = "store" if params else "config"
    return Endpoint(name, "GET", PREFIX + path, kind, "list", wrapper, record, tuple(params))


def _read(name: str, path: str, wrapper: str, record: str, *extra: Param, shape: Shape = "list") -> Endpoint:
    return Endpoint(
        name, "GET", PREFIX + path, "client_read", shape, wrapper, record, (CLIENT_NUMBER, *extra)
    )


def _write(
    name: str, path: str, required: tuple[str, ...], answer: tuple[str, ...], kind: Kind = "client_write"
) -> Endpoint:
    return Endpoint(name, "POST", PREFIX + path, kind, "answer", None, None, (), required, answer)


CONFIG_ENDPOINTS: tuple[Endpoint, ...] = (
    _config("packagelist", "packages/packagelist", "packages", "packageInfo"),
    _config("storelist", "stores/storelist", "stores", "storeInfo"),
    _config("eft_memberships", "memberships/eft", "memberships", "eftMembershipInfo"),
    _config("noneft_memberships", "memberships/noneft", "memberships", "nonEftMembershipInfo"),
    _config("eft_deduct_types", "memberships/eftdeducttypes", "types", "eftDeductTypes"),
    _config("eft_draw_days", "memberships/eftdrawdays", "types", "eftDrawDays"),
    _config("skin_types", "setup/skintypes", "types", "skintypes"),
    _config("webdocs", "setup/webdocs", "webdocs", "webdoc"),
    _config("payment_types", "setup/paymenttypes", "paymentTypes", "paymentType", STORECODE),
    _config("employees", "setup/employees", "employees", "employee", STORECODE),
    _config("products", "setup/getproducts", "products", "products", STORECODE),
    _config(
        "processor_credentials",
        "setup/getprocessorcredentials",
        "products",
        "processorCredentials",
        STORECODE,
        Param("type", kind="credtype"),
    ),
    _config("profile_questions", "setup/profilequestions", "questions", "profileQuestion"),
)

CLIENT_READ_ENDPOINTS: tuple[Endpoint, ...] = (
    _read("clientdetails", "clients/clientdetails", "client", "client", shape="object"),
    _read("ledgerbalance", "clients/ledgerbalance", "balances", "ledgerBalance"),
    _read("commprefs", "clients/commprefs", "preferences", "commPrefs", shape="object"),
    _read("clientmemberships", "clients/clientmemberships", "memberships", "clientMembership"),
    _read("clientpackages", "clients/clientpackages", "packages", "clientPackage"),
    _read("pointsbalance", "clients/pointsbalance", "balances", "pointsBalance"),
    _read(
        "getpointstransactions",
        "clients/getpointstransactions",
        "transactions",
        "pointsTransaction",
        Param("startDate", kind="date"),
        Param("endDate", kind="date"),
    ),
    _read("billinginfo", "clients/billinginfo", "accounts", "billingAccount"),
    _read(
        "transactionhistory",
        "clients/transactionhistory",
        "transactions",
        "transaction",
        Param("startDate", required=False, kind="date"),
        Param("endDate", required=False, kind="date"),
    ),
    Endpoint(
        "affiliatedpackageclients",
        "GET",
        PREFIX + "setup/affiliatedpackageclients",
        "client_read",
        "list",
        "clients",
        "affiliatedClient",
        (Param("membershipId"),),
    ),
)

SEARCH_CRITERIA: tuple[str, ...] = ("storecode", "lastName", "firstName", "email", "phone", "modifiedSince")

SEARCH = Endpoint(
    "search",
    "GET",
    PREFIX + "clients/search",
    "search",
    "list",
    "clients",
    "clientSummary",
    (
        Param("storecode", required=False, kind="storecode"),
        Param("lastName", required=False),
        Param("firstName", required=False),
        Param("email", required=False),
        Param("phone", required=False),
        Param("modifiedSince", required=False, kind="datetime"),
        Param("page", required=False, kind="int"),
        Param("pageSize", required=False, kind="int"),
    ),
)

_CN = ("clientNumber",)
WRITE_ENDPOINTS: tuple[Endpoint, ...] = (
    _write("insert_client", "clients/insert", ("storecode", "empNo"), ("clientNumber",)),
    _write("update_demographics", "clients/updatedemographics", _CN, ("client",)),
    _write(
        "update_billing_info",
        "clients/updatebillinginfo",
        (*_CN, "membershipId", "type", "deductType"),
        ("billingAccountId",),
    ),
    _write("insert_comment", "clients/insertcomment", (*_CN, "empNo", "text"), ("commentId",)),
    _write(
        "insert_membership",
        "clients/insertMembership",
        (*_CN, "storecode", "empNo", "membershipTypeId", "isEft"),
        ("membershipId",),
    ),
    _write(
        "insert_gift_cert",
        "clients/insertgiftcert",
        (*_CN, "storecode", "giftCertNo", "amount"),
        ("giftCertNo",),
    ),
    _write(
        "freeze_membership",
        "clients/freezemembership",
        (*_CN, "membershipId", "freezeStartDate"),
        ("membership",),
    ),
    _write("unfreeze_membership", "clients/unfreezemembership", (*_CN, "membershipId"), ("membership",)),
    _write("activate_membership", "clients/activatemembership", (*_CN, "membershipId"), ("membership",)),
    _write(
        "upgrade_membership",
        "clients/upgrademembership",
        (*_CN, "membershipId", "newMembershipTypeId"),
        ("membership",),
    ),
    _write(
        "downgrade_membership",
        "clients/downgrademembership",
        (*_CN, "membershipId", "newMembershipTypeId"),
        ("membership",),
    ),
    _write("cancel_membership", "clients/cancelmembership", (*_CN, "membershipId"), ("membership",)),
    _write(
        "post_account_ledger_payment",
        "clients/postaccountledgerpayment",
        (*_CN, "storecode", "amount", "paymentType"),
        ("balance",),
    ),
    _write(
        "insert_points",
        "clients/insertpoints",
        (*_CN, "storecode", "points", "reason"),
        ("pointsTransactionId",),
    ),
    _write("update_comm_prefs", "clients/updateclientcommpref", _CN, ("preferences",)),
    _write(
        "insert_transaction",
        "clients/inserttransaction",
        (*_CN, "storecode", "empNo", "lines"),
        ("receiptNumber",),
    ),
    _write(
        "insert_payment", "clients/insertpayment", ("receiptNumber", "paymentType", "amount"), ("paymentId",)
    ),
    _write(
        "share_affiliated_package", "clients/shareaffiliatedpackage", ("membershipId", *_CN), ("clients",)
    ),
    _write(
        "unshare_affiliated_package", "clients/unshareaffiliatedpackage", ("membershipId", *_CN), ("clients",)
    ),
    _write("insert_profile_answers", "clients/insertprofileanswers", (*_CN, "answers"), ("count",)),
    _write("add_referral", "clients/addreferral", (*_CN, "referredClientNumber"), ("referralId",)),
    _write("generate_web_document", "clients/generatewebdocument", (*_CN, "docId"), ("url",)),
    _write(
        "register_user",
        "users/register",
        ("username", "password", "email", "firstName", "lastName", "storecode"),
        ("clientNumber", "user"),
        kind="user_write",
    ),
    _write(
        "reset_password", "users/resetpassword", ("username", "newPassword"), ("reset",), kind="user_write"
    ),
    _write("login", "users/login", ("username", "password"), ("valid", "clientNumber"), kind="user_write"),
)

ENDPOINTS: tuple[Endpoint, ...] = (*CONFIG_ENDPOINTS, *CLIENT_READ_ENDPOINTS, SEARCH, *WRITE_ENDPOINTS)
BY_NAME: dict[str, Endpoint] = {e.name: e for e in ENDPOINTS}

# Fields of the service's records and write bodies whose values are secrets (processor
# credentials, card and bank tokens, user passwords): declared once here, they never land
# (models.tables keeps them out of every table and of ``extra``) and are masked in every log
# line and error text (extract.redact), whatever record they appear in.
SECRET_FIELDS: frozenset[str] = frozenset(
    {"username", "password", "newPassword", "apiKey", "tokenId", "vaultToken", "accountNo", "routingNo"}
)

# Personal data, declared once beside the secrets: the fields of a record that identify a
# person, by record type. Landing keeps them in the identified tier only (models.tables: the
# identity tables; every other table carries a surrogate client key instead of the number),
# ``membersync forget`` erases them, and the analyst tier never reads them.
PERSONAL_FIELDS: dict[str, frozenset[str]] = {
    "client": frozenset(
        {
            "firstName",
            "lastName",
            "email",
            "phone",
            "birthDate",
            "gender",
            "address1",
            "address2",
            "city",
            "state",
            "postalCode",
        }
    ),
    # a search hit names the client it lists; an affiliated package names who shares it
    "clientSummary": frozenset({"firstName", "lastName", "email", "phone"}),
    "affiliatedClient": frozenset({"firstName", "lastName"}),
}
# Records that describe a person: every field they carry beyond their declared columns is
# personal too (a tenant's ``middleName`` or ``mobile``), so their ``extra`` never lands outside
# the identified tier.
PERSONAL_RECORDS: frozenset[str] = frozenset(PERSONAL_FIELDS)
# Fields that hold a client number: an identifier of a person, landed as the client's surrogate
# key (the identity table holds the only link between the two).
CLIENT_NUMBER_FIELDS: frozenset[str] = frozenset(
    {"clientNumber", "referredBy", "sharedFromClientNumber", "referredClientNumber"}
)
# Names that are personal wherever they appear: an unknown field of any other record with one of
# these names is dropped from its ``extra`` (a tenant that adds ``clientName`` to transactions).
PERSONAL_EXTRA_FIELDS: frozenset[str] = frozenset(
    {
        "firstName",
        "lastName",
        "middleName",
        "fullName",
        "clientName",
        "email",
        "phone",
        "mobile",
        "mobilePhone",
        "birthDate",
        "dateOfBirth",
        "address1",
        "address2",
        "postalCode",
        "zip",
    }
)

# Enumerations of the contract (compare case-insensitively; unknown values are kept verbatim).
MEMBERSHIP_STATUSES = ("Active", "Frozen", "OnHold", "Canceled", "Expired")
TRANSACTION_TYPES = ("R", "P", "M", "1", "G")
TRANSACTION_STATUSES = ("Saved", "Voided")
BILLING_TYPES = ("CARD", "CHECKING")
CREDENTIAL_TYPES = ("POS", "EFT")
PAYMENT_KINDS = ("CASH", "CARD", "CHECK", "GIFT", "ACCOUNT", "OTHER")
ANSWER_TYPES = ("TEXT", "CHOICE", "YESNO")
# The field a transaction line of each type requires (interface document, section 4.3).
LINE_REQUIRED_FIELD = {
    "R": "productNumber",
    "P": "packageId",
    "M": "membershipId",
    "1": "membershipId",
    "G": "giftCertNo",
}

# Records nested inside other records, and records inside write answers: the tenant profile
# renames their fields with their own field maps (client and sandbox alike).
NESTED_RECORDS: dict[str, dict[str, str]] = {
    "transaction": {"lines": "transactionLine", "payments": "transactionPayment"},
}
ANSWER_RECORDS: dict[str, str] = {
    "membership": "clientMembership",
    "client": "client",
    "preferences": "commPrefs",
    "clients": "affiliatedClient",
}

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def endpoint(name: str) -> Endpoint:
    """The endpoint with this logical name (KeyError names it when unknown)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown endpoint {name!r}") from None
