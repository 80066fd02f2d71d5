"""The records and answers of the contract as TypedDicts (logical field names).

They are plain dicts at runtime (no validation, no copies: the client returns the parsed
JSON as is); the types document what a caller may read and let mypy check it. Values are
exactly as received: money may be a number or a numeric string, ids are strings. Typing
the values is the landing step's job (:mod:`membersync.models.coerce`). Every record may
carry extra fields, and optional ones may be absent, hence ``total=False``.

Request bodies of the writes (``...Body``) mark their required fields with ``Required``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Required, TypedDict

Money = float | int | str  # JSON number or numeric string; landing turns it into Decimal
Count = int | str

# -- configuration -------------------------------------------------------------------------


class StoreInfo(TypedDict, total=False):
    storecode: str
    name: str
    city: str
    state: str
    timezone: str
    active: bool


class PackageInfo(TypedDict, total=False):
    packageId: str
    name: str
    price: Money
    sessions: Count
    affiliated: bool
    storecode: str | None


class EftMembershipInfo(TypedDict, total=False):
    membershipTypeId: str
    name: str
    monthlyDues: Money
    enrollmentFee: Money
    storecode: str | None


class NonEftMembershipInfo(TypedDict, total=False):
    membershipTypeId: str
    name: str
    price: Money
    termMonths: Count
    storecode: str | None


class CodeDescription(TypedDict, total=False):  # eftDeductTypes, skintypes
    code: str
    description: str


class EftDrawDay(TypedDict, total=False):
    day: Count
    description: str


class WebDoc(TypedDict, total=False):
    docId: str
    name: str


class PaymentType(TypedDict, total=False):
    code: str
    description: str
    kind: str


class Employee(TypedDict, total=False):
    empNo: str
    firstName: str
    lastName: str
    storecode: str
    role: str


class Product(TypedDict, total=False):
    productNumber: str
    name: str
    price: Money
    category: str
    storecode: str


class ProcessorCredentials(TypedDict, total=False):  # username, password, apiKey are SECRET
    processor: str
    merchantId: str
    username: str
    password: str
    apiKey: str


class ProfileQuestion(TypedDict, total=False):
    questionId: str
    text: str
    answerType: str
    choices: list[str]


# -- client reads --------------------------------------------------------------------------


class ClientSummary(TypedDict, total=False):
    clientNumber: str
    firstName: str
    lastName: str
    email: str
    homeStore: str
    lastModified: str


class Client(TypedDict, total=False):
    clientNumber: str
    firstName: str
    lastName: str
    email: str
    phone: str
    birthDate: str
    gender: str
    address1: str
    city: str
    state: str
    postalCode: str
    homeStore: str
    referredBy: str | None
    skinType: str | None
    createdDate: str
    lastModified: str


class LedgerBalance(TypedDict, total=False):
    storecode: str
    balance: Money
    asOf: str


class CommPrefs(TypedDict, total=False):
    email: bool
    sms: bool
    mail: bool
    phone: bool
    marketing: bool


class ClientMembership(TypedDict, total=False):
    membershipId: str
    membershipTypeId: str
    name: str
    isEft: bool
    status: str
    storecode: str
    startDate: str
    endDate: str | None
    drawDay: Count | None
    monthlyDues: Money | None
    price: Money | None
    freezeStartDate: str | None
    freezeEndDate: str | None
    cancelDate: str | None
    lastModified: str


class ClientPackage(TypedDict, total=False):
    clientPackageId: str
    packageId: str
    name: str
    storecode: str
    purchaseDate: str
    expirationDate: str | None
    sessionsTotal: Count
    sessionsRemaining: Count
    sharedFromClientNumber: str | None


class PointsBalance(TypedDict, total=False):
    storecode: str
    points: Count


class PointsTransaction(TypedDict, total=False):
    pointsTransactionId: str
    date: str
    storecode: str
    points: Count
    reason: str
    receiptNumber: str | None


class BillingAccount(TypedDict, total=False):  # tokenId, vaultToken, accountNo, routingNo are SECRET
    billingAccountId: str
    membershipId: str
    type: str
    deductType: str
    lastFour: str
    expMonth: Count
    expYear: Count
    tokenId: str
    vaultToken: str
    accountNo: str
    routingNo: str


class TransactionLine(TypedDict, total=False):
    lineNo: Count
    type: str
    productNumber: str
    packageId: str
    membershipId: str
    giftCertNo: str
    description: str
    quantity: Count  # whole units (the landed column is int64; the sandbox refuses fractions)
    pricePerUnit: Money
    amount: Money
    tax: Money


class TransactionPayment(TypedDict, total=False):
    paymentId: str
    paymentType: str
    amount: Money
    date: str


class Transaction(TypedDict, total=False):
    receiptNumber: str
    transactionDate: str
    storecode: str
    empNo: str
    status: str
    lines: list[TransactionLine]
    payments: list[TransactionPayment]


class AffiliatedClient(TypedDict, total=False):
    clientNumber: str
    firstName: str
    lastName: str
    sharedDate: str


@dataclass(slots=True)
class SearchPage:
    """One page of ``clients/search``: its items (logical names) and the paging numbers."""

    items: list[ClientSummary] = field(default_factory=list)
    page: int = 1
    page_size: int = 0
    total_count: int = 0


# -- write bodies (logical names; keyword arguments of the client's write methods) ----------


class InsertClientBody(TypedDict, total=False):
    storecode: Required[str]
    empNo: Required[str]
    firstName: str
    lastName: str
    email: str
    phone: str
    birthDate: str
    gender: str
    address1: str
    city: str
    state: str
    postalCode: str
    referredBy: str
    skinType: str


class UpdateDemographicsBody(TypedDict, total=False):
    clientNumber: Required[str]
    firstName: str
    lastName: str
    email: str
    phone: str
    birthDate: str
    gender: str
    address1: str
    city: str
    state: str
    postalCode: str
    homeStore: str
    referredBy: str
    skinType: str


class UpdateBillingInfoBody(TypedDict, total=False):
    clientNumber: Required[str]
    membershipId: Required[str]
    type: Required[str]
    deductType: Required[str]
    lastFour: str
    expMonth: int | str
    expYear: int | str
    tokenId: str
    vaultToken: str
    accountNo: str
    routingNo: str


class InsertCommentBody(TypedDict, total=False):
    clientNumber: Required[str]
    empNo: Required[str]
    text: Required[str]


class InsertMembershipBody(TypedDict, total=False):
    clientNumber: Required[str]
    storecode: Required[str]
    empNo: Required[str]
    membershipTypeId: Required[str]
    isEft: Required[bool]
    drawDay: int
    startDate: str
    onHold: bool


class InsertGiftCertBody(TypedDict, total=False):
    clientNumber: Required[str]
    storecode: Required[str]
    giftCertNo: Required[str]
    amount: Required[Money]


class FreezeMembershipBody(TypedDict, total=False):
    clientNumber: Required[str]
    membershipId: Required[str]
    freezeStartDate: Required[str]
    freezeEndDate: str


class MembershipBody(TypedDict, total=False):  # unfreeze, activate
    clientNumber: Required[str]
    membershipId: Required[str]


class CancelMembershipBody(TypedDict, total=False):
    clientNumber: Required[str]
    membershipId: Required[str]
    cancelDate: str


class ChangeMembershipBody(TypedDict, total=False):  # upgrade, downgrade
    clientNumber: Required[str]
    membershipId: Required[str]
    newMembershipTypeId: Required[str]


class PostAccountLedgerPaymentBody(TypedDict, total=False):
    clientNumber: Required[str]
    storecode: Required[str]
    amount: Required[Money]
    paymentType: Required[str]


class InsertPointsBody(TypedDict, total=False):
    clientNumber: Required[str]
    storecode: Required[str]
    points: Required[int]
    reason: Required[str]


class UpdateCommPrefsBody(TypedDict, total=False):
    clientNumber: Required[str]
    email: bool
    sms: bool
    mail: bool
    phone: bool
    marketing: bool


class TransactionLineIn(TypedDict, total=False):
    type: Required[str]
    productNumber: str
    packageId: str
    membershipId: str
    giftCertNo: str
    quantity: Count
    pricePerUnit: Money
    tax: Money


class InsertTransactionBody(TypedDict, total=False):
    clientNumber: Required[str]
    storecode: Required[str]
    empNo: Required[str]
    lines: Required[list[TransactionLineIn]]


class InsertPaymentBody(TypedDict, total=False):
    receiptNumber: Required[str]
    paymentType: Required[str]
    amount: Required[Money]


class AffiliatedPackageBody(TypedDict, total=False):
    membershipId: Required[str]
    clientNumber: Required[str]


class ProfileAnswer(TypedDict):
    questionId: str
    answer: Any


class InsertProfileAnswersBody(TypedDict, total=False):
    clientNumber: Required[str]
    answers: Required[list[ProfileAnswer]]


class AddReferralBody(TypedDict, total=False):
    clientNumber: Required[str]
    referredClientNumber: Required[str]


class GenerateWebDocumentBody(TypedDict, total=False):
    clientNumber: Required[str]
    docId: Required[str]


class RegisterUserBody(TypedDict, total=False):
    username: Required[str]
    password: Required[str]
    email: Required[str]
    firstName: Required[str]
    lastName: Required[str]
    storecode: Required[str]


class ResetPasswordBody(TypedDict, total=False):
    username: Required[str]
    newPassword: Required[str]


class LoginBody(TypedDict, total=False):
    username: Required[str]
    password: Required[str]


# -- write answers ----------------------------------------------------------------------------


class InsertClientAnswer(TypedDict, total=False):
    clientNumber: str


class ClientAnswer(TypedDict, total=False):
    client: Client


class BillingAccountAnswer(TypedDict, total=False):
    billingAccountId: str


class CommentAnswer(TypedDict, total=False):
    commentId: str


class MembershipIdAnswer(TypedDict, total=False):
    membershipId: str


class GiftCertAnswer(TypedDict, total=False):
    giftCertNo: str


class MembershipAnswer(TypedDict, total=False):
    membership: ClientMembership


class BalanceAnswer(TypedDict, total=False):
    balance: Any  # the store ledger after the payment


class PointsAnswer(TypedDict, total=False):
    pointsTransactionId: str


class PreferencesAnswer(TypedDict, total=False):
    preferences: CommPrefs


class ReceiptAnswer(TypedDict, total=False):
    receiptNumber: str


class PaymentAnswer(TypedDict, total=False):
    paymentId: str


class SharedClientsAnswer(TypedDict, total=False):
    clients: list[AffiliatedClient]


class CountAnswer(TypedDict, total=False):
    count: int


class ReferralAnswer(TypedDict, total=False):
    referralId: str


class UrlAnswer(TypedDict, total=False):
    url: str


class User(TypedDict, total=False):
    username: str
    clientNumber: str


class RegisterAnswer(TypedDict, total=False):
    clientNumber: str
    user: User


class ResetAnswer(TypedDict, total=False):
    reset: bool


class LoginAnswer(TypedDict, total=False):
    valid: bool
    clientNumber: str | None
