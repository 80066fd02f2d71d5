"""Every endpoint through our client against the sandbox (real HTTP on loopback).

Answers are compared with the sandbox's in-memory service (ground truth, read on the
server's own thread with ``sandbox.call``). Reads use the session's sandbox; writes get a
fresh one so that other tests' truth does not move.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import pytest
from membersync.extract import catalogue, errors
from membersync.extract.client import ClientOptions, ServiceClient
from membersync.extract.profile import Profile
from membersync.extract.sandbox.running import RunningSandbox

T = TypeVar("T")
FAST = ClientOptions(backoff_base=0.01, backoff_max=0.05)


def client_for(sandbox: RunningSandbox, **kw: Any) -> ServiceClient:
    config = sandbox.config
    kw.setdefault("options", FAST)
    return ServiceClient(sandbox.url, config.username, config.password, **kw)


def using(sandbox: RunningSandbox, body: Callable[[ServiceClient], Awaitable[T]], **kw: Any) -> T:
    async def go() -> T:
        async with client_for(sandbox, **kw) as client:
            return await body(client)

    return asyncio.run(go())


def wire(value: Any) -> Any:
    """What the server's JSON of a ground-truth value looks like once parsed."""
    return orjson.loads(orjson.dumps(value, default=str))


def stores_of(sandbox: RunningSandbox) -> list[str]:
    return sandbox.call(lambda s: list(s.stores))


def some_clients(sandbox: RunningSandbox, n: int = 8) -> list[str]:
    numbers = sandbox.call(lambda s: sorted(s.clients))
    step = max(1, len(numbers) // n)
    return numbers[::step][:n]


# -- configuration ----------------------------------------------------------------------------

CONFIG = [e.name for e in catalogue.CONFIG_ENDPOINTS if e.kind == "config"]


@pytest.mark.parametrize("name", CONFIG)
def test_config_list(sandbox: RunningSandbox, name: str) -> None:
    got = using(sandbox, lambda c: getattr(c, name)())
    truth = sandbox.call(lambda s: getattr(s, name)())
    assert got == wire(truth) and got


@pytest.mark.parametrize("name", ["payment_types", "employees", "products"])
def test_store_scoped_list(sandbox: RunningSandbox, name: str) -> None:
    for code in stores_of(sandbox):
        got = using(sandbox, lambda c, code=code: getattr(c, name)(code))  # type: ignore[misc]
        assert got == wire(sandbox.call(lambda s, code=code: getattr(s, name)(code))), code  # type: ignore[misc]


def test_processor_credentials(sandbox: RunningSandbox) -> None:
    code = stores_of(sandbox)[0]
    for kind in ("POS", "EFT"):
        got = using(sandbox, lambda c, kind=kind: c.processor_credentials(code, kind))  # type: ignore[misc]
        assert got == wire(sandbox.call(lambda s, kind=kind: s.processor_credentials(code, kind)))  # type: ignore[misc]


# -- client reads ---------------------------------------------------------------------------------

READS = ["clientdetails", "ledgerbalance", "commprefs", "clientmemberships", "clientpackages"]
READS += ["pointsbalance", "billinginfo", "transactionhistory"]


@pytest.mark.parametrize("name", READS)
def test_client_read(sandbox: RunningSandbox, name: str) -> None:
    numbers = some_clients(sandbox)

    async def body(client: ServiceClient) -> list[Any]:
        return list(await asyncio.gather(*(getattr(client, name)(n) for n in numbers)))

    got = using(sandbox, body)
    truth = sandbox.call(lambda s: [getattr(s, name)(n) for n in numbers])
    assert got == wire(truth)


def test_dated_reads(sandbox: RunningSandbox) -> None:
    numbers = some_clients(sandbox)
    anchor = sandbox.config.anchor
    start, end = anchor - dt.timedelta(days=400), anchor

    async def body(client: ServiceClient) -> tuple[list[Any], list[Any]]:
        points = [await client.getpointstransactions(n, start, end) for n in numbers]
        history = [await client.transactionhistory(n, start, end) for n in numbers]
        return points, history

    points, history = using(sandbox, body)
    assert points == wire(sandbox.call(lambda s: [s.getpointstransactions(n, start, end) for n in numbers]))
    assert history == wire(sandbox.call(lambda s: [s.transactionhistory(n, start, end) for n in numbers]))
    assert any(points) and any(history)


def test_affiliatedpackageclients(sandbox: RunningSandbox) -> None:
    ids = sandbox.call(lambda s: sorted(s.affiliated)[:5])
    assert ids, "the sandbox has no affiliated package"
    got = using(sandbox, lambda c: asyncio.gather(*(c.affiliatedpackageclients(i) for i in ids)))
    assert list(got) == wire(sandbox.call(lambda s: [s.affiliatedpackageclients(i) for i in ids]))


def test_generic_get_matches_the_typed_method(sandbox: RunningSandbox) -> None:
    number = some_clients(sandbox, 1)[0]

    async def body(client: ServiceClient) -> tuple[Any, Any]:
        return await client.get("clientdetails", clientNumber=number), await client.clientdetails(number)

    generic, typed = using(sandbox, body)
    assert generic == typed and generic["clientNumber"] == number


# -- search -------------------------------------------------------------------------------------------


def test_paging_over_all_clients(sandbox: RunningSandbox) -> None:
    since = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

    async def body(client: ServiceClient) -> tuple[list[str], list[int]]:
        numbers: list[str] = []
        sizes: list[int] = []
        async for page in client.search(modifiedSince=since):
            numbers += [c["clientNumber"] for c in page.items]
            sizes.append(len(page.items))
        return numbers, sizes

    numbers, sizes = using(sandbox, body, options=ClientOptions(page_size=37))
    truth = sandbox.call(lambda s: sorted(s.clients))
    assert numbers == truth  # every client once, in clientNumber order
    assert len(sizes) == -(-len(truth) // 37)


def test_search_by_store_and_page(sandbox: RunningSandbox) -> None:
    code = stores_of(sandbox)[1]

    async def body(client: ServiceClient) -> Any:
        first = await client.search_page(1, 10, storecode=code)
        every = [c async for p in client.search(storecode=code) for c in p.items]
        return first, every

    first, every = using(sandbox, body)
    truth = sandbox.call(lambda s: sorted(n for n, c in s.clients.items() if c.home_store == code))
    assert first.total_count == len(truth) and first.page == 1 and first.page_size == 10
    assert [c["clientNumber"] for c in first.items] == truth[:10]
    assert [c["clientNumber"] for c in every] == truth


# -- errors ---------------------------------------------------------------------------------------------


def test_wrong_credentials_are_an_authentication_error_without_retry(sandbox: RunningSandbox) -> None:
    before = sandbox.stats.unauthorized
    client = ServiceClient(sandbox.url, sandbox.config.username, "not-the-password", options=FAST)

    async def go() -> None:
        async with client:
            await client.storelist()

    with pytest.raises(errors.AuthenticationError) as info:
        asyncio.run(go())
    assert info.value.status == 401 and info.value.endpoint == "storelist"
    assert client.stats.requests == 1 and client.stats.retries == 0
    assert sandbox.stats.unauthorized == before + 1
    assert "not-the-password" not in str(info.value)


def test_unknown_client_is_not_found(sandbox: RunningSandbox) -> None:
    with pytest.raises(errors.NotFoundError) as info:
        using(sandbox, lambda c: c.clientdetails("999999999"))
    assert "clientdetails" in str(info.value) and "clientNumber" in str(info.value)


VALIDATION_READS: list[tuple[str, Callable[[ServiceClient], Awaitable[Any]]]] = [
    ("storecode", lambda c: c.payment_types("SHORT")),
    ("storecode", lambda c: c.employees("WAY TOO LONG STORE")),
    ("storecode", lambda c: c.products("")),
    ("type", lambda c: c.processor_credentials("DOWNTOWN  ", "XYZ")),
    ("type", lambda c: c.processor_credentials("DOWNTOWN  ", "POSS")),
    ("pageSize", lambda c: c.search_page(1, 501, lastName="A")),
    ("storecode", lambda c: c.search_page(1, 10, storecode="ABC")),
]


@pytest.mark.parametrize(("field", "call"), VALIDATION_READS)
def test_read_validation_names_the_field(
    sandbox: RunningSandbox, field: str, call: Callable[[ServiceClient], Awaitable[Any]]
) -> None:
    with pytest.raises(errors.BadRequestError) as info:
        using(sandbox, call)
    assert info.value.field == field, str(info.value)
    assert field in str(info.value) and "HTTP 400" in str(info.value)


GENERIC_GET_MISUSE: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("no_such_endpoint", {}, KeyError, "unknown endpoint 'no_such_endpoint'"),
    ("login", {}, ValueError, "login is a POST endpoint: use post()"),
    ("employees", {"storecode": "DOWNTOWN  ", "colour": "red"}, ValueError, "unknown parameter 'colour'"),
    ("employees", {}, ValueError, "parameter 'storecode' is required"),
    ("processor_credentials", {"storecode": "DOWNTOWN  ", "type": None}, ValueError, "'type' is required"),
]


@pytest.mark.parametrize(("name", "params", "error", "text"), GENERIC_GET_MISUSE)
def test_case_generic_get_misused_fails_clearly_before_any_request(
    sandbox: RunningSandbox, name: str, params: dict[str, Any], error: type[Exception], text: str
) -> None:
    """``client.get(name, **params)`` checks the name and parameters against the catalogue."""
    client = client_for(sandbox)

    async def go() -> None:
        async with client:
            await client.get(name, **params)

    with pytest.raises(error) as info:
        asyncio.run(go())
    assert text in str(info.value)
    assert client.stats.requests == 0


# -- writes ---------------------------------------------------------------------------------------------


class World:
    """Handy values of a fresh sandbox, read through the client itself."""

    def __init__(self, sandbox: RunningSandbox) -> None:
        self.sandbox = sandbox

    async def load(self, client: ServiceClient) -> World:
        stores = await client.storelist()
        self.store = stores[0]["storecode"]
        self.emp = (await client.employees(self.store))[0]["empNo"]
        self.payment_type = (await client.payment_types(self.store))[0]["code"]
        self.product = (await client.products(self.store))[0]["productNumber"]
        eft = [t for t in await client.eft_memberships() if t.get("storecode") in (None, self.store)]
        eft.sort(key=lambda t: float(t["monthlyDues"]))
        assert len({float(t["monthlyDues"]) for t in eft}) >= 2, "need two EFT prices for up/downgrades"
        self.cheap, self.dear = eft[0]["membershipTypeId"], eft[-1]["membershipTypeId"]
        noneft = [t for t in await client.noneft_memberships() if t.get("storecode") in (None, self.store)]
        self.noneft = noneft[0]["membershipTypeId"]
        self.draw_day = int((await client.eft_draw_days())[0]["day"])
        self.deduct = (await client.eft_deduct_types())[0]["code"]
        self.doc = (await client.webdocs())[0]["docId"]
        self.questions = await client.profile_questions()
        return self

    async def new_client(self, client: ServiceClient, last: str = "Tester") -> str:
        answer = await client.insert_client(
            storecode=self.store, empNo=self.emp, firstName="Ann", lastName=last
        )
        return answer["clientNumber"]

    async def membership(self, client: ServiceClient, number: str, state: str = "Active") -> str:
        answer = await client.insert_membership(
            clientNumber=number,
            storecode=self.store,
            empNo=self.emp,
            membershipTypeId=self.cheap,
            isEft=True,
            drawDay=self.draw_day,
            onHold=state == "OnHold",
        )
        mid = answer["membershipId"]
        if state == "Frozen":
            await client.freeze_membership(
                clientNumber=number, membershipId=mid, freezeStartDate="2030-01-01"
            )
        elif state == "Canceled":
            await client.cancel_membership(clientNumber=number, membershipId=mid)
        return mid

    def status(self, mid: str) -> str:
        return self.sandbox.call(lambda s: s.memberships[mid].status)


@pytest.fixture
def write_sandbox(fresh_sandbox: Callable[..., RunningSandbox]) -> RunningSandbox:
    return fresh_sandbox(clients=30, seed=7)


def test_client_writes_end_to_end(write_sandbox: RunningSandbox) -> None:
    sb = write_sandbox

    async def body(client: ServiceClient) -> dict[str, Any]:
        w = await World(sb).load(client)
        out: dict[str, Any] = {}
        number = out["number"] = await w.new_client(client)
        other = await w.new_client(client, "Other")
        out["demo"] = await client.update_demographics(clientNumber=number, city="Springfield")
        out["comment"] = await client.insert_comment(clientNumber=number, empNo=w.emp, text="hello")
        mid = out["mid"] = await w.membership(client, number)
        out["card"] = await client.update_billing_info(
            clientNumber=number,
            membershipId=mid,
            type="CARD",
            deductType=w.deduct,
            lastFour="4242",
            expMonth=12,
            expYear=2030,
            tokenId="tok_abcdef",
        )
        out["check"] = await client.update_billing_info(
            clientNumber=number,
            membershipId=mid,
            type="CHECKING",
            deductType=w.deduct,
            accountNo="123456789",
            routingNo="021000021",
        )
        out["gift"] = await client.insert_gift_cert(
            clientNumber=number, storecode=w.store, giftCertNo="GC-TEST-1", amount="25.00"
        )
        out["points"] = await client.insert_points(
            clientNumber=number, storecode=w.store, points=40, reason="promo"
        )
        out["prefs"] = await client.update_comm_prefs(clientNumber=number, sms=True)
        receipt = await client.insert_transaction(
            clientNumber=number,
            storecode=w.store,
            empNo=w.emp,
            lines=[
                {
                    "type": "R",
                    "productNumber": w.product,
                    "quantity": 2,
                    "pricePerUnit": "10.00",
                    "tax": "1.60",
                }
            ],
        )
        out["receipt"] = receipt
        out["payment"] = await client.insert_payment(
            receiptNumber=receipt["receiptNumber"], paymentType=w.payment_type, amount="5.00"
        )
        out["ledger"] = await client.post_account_ledger_payment(
            clientNumber=number, storecode=w.store, amount="1.60", paymentType=w.payment_type
        )
        q = w.questions[0]
        answer = {"TEXT": "fine", "YESNO": "YES"}.get(q["answerType"]) or q["choices"][0]
        out["answers"] = await client.insert_profile_answers(
            clientNumber=number, answers=[{"questionId": q["questionId"], "answer": answer}]
        )
        out["referral"] = await client.add_referral(clientNumber=number, referredClientNumber=other)
        out["doc"] = await client.generate_web_document(clientNumber=number, docId=w.doc)
        affiliated = sb.call(lambda s: sorted(s.affiliated)[0])
        out["shared"] = await client.share_affiliated_package(membershipId=affiliated, clientNumber=number)
        out["sharing"] = await client.affiliatedpackageclients(affiliated)
        out["unshared"] = await client.unshare_affiliated_package(
            membershipId=affiliated, clientNumber=number
        )
        out["details"] = await client.clientdetails(number)
        out["ledgerbalance"] = await client.ledgerbalance(number)
        return out

    out = using(sb, body)
    number = out["number"]
    truth = sb.call(lambda s: s.client(number))
    assert out["demo"]["client"]["city"] == "Springfield" == truth.city
    assert out["comment"]["commentId"] == truth.comments[0].comment_id
    assert out["card"]["billingAccountId"] == out["check"]["billingAccountId"]
    account = sb.call(lambda s: s.billing_accounts[out["card"]["billingAccountId"]])
    assert account.type == "CHECKING" and account.routing_no == "021000021"
    assert out["gift"] == {"giftCertNo": "GC-TEST-1"}
    assert out["points"]["pointsTransactionId"] == truth.points_transactions[-1].points_transaction_id
    assert out["prefs"]["preferences"]["sms"] is True
    txn = sb.call(lambda s: s.transactions[out["receipt"]["receiptNumber"]])
    assert str(txn.total) == "21.60" and txn.payments[0].payment_id == out["payment"]["paymentId"]
    assert float(out["ledger"]["balance"]) == pytest.approx(15.00)  # 21.60 - 5.00 - 1.60
    assert [b["balance"] for b in out["ledgerbalance"]] and str(truth.ledger[txn.storecode]) == "15.00"
    assert out["answers"] == {"count": 1}
    assert out["referral"]["referralId"].startswith("RF")
    assert out["doc"]["url"].startswith("https://")
    assert number in [c["clientNumber"] for c in out["shared"]["clients"]]
    assert out["sharing"] == out["shared"]["clients"]
    assert number not in [c["clientNumber"] for c in out["unshared"]["clients"]]
    assert out["details"]["clientNumber"] == number


def test_user_endpoints(write_sandbox: RunningSandbox) -> None:
    sb = write_sandbox

    async def body(client: ServiceClient) -> dict[str, Any]:
        w = await World(sb).load(client)
        out: dict[str, Any] = {}
        out["register"] = await client.register_user(
            username="ann",
            password="first-Pass-1",
            email="a@x.test",
            firstName="Ann",
            lastName="Lee",
            storecode=w.store,
        )
        out["ok"] = await client.login(username="ann", password="first-Pass-1")
        out["bad"] = await client.login(username="ann", password="wrong-Pass-1")
        out["reset"] = await client.reset_password(username="ann", newPassword="second-Pass-2")
        out["new"] = await client.login(username="ann", password="second-Pass-2")
        with pytest.raises(errors.ConflictError) as info:
            await client.register_user(
                username="ann",
                password="third-Pass-3",
                email="b@x.test",
                firstName="B",
                lastName="C",
                storecode=w.store,
            )
        out["taken"] = info.value
        return out

    out = using(sb, body)
    number = out["register"]["clientNumber"]
    assert out["register"]["user"] == {"username": "ann", "clientNumber": number}
    assert out["ok"] == {"valid": True, "clientNumber": number}
    assert out["bad"] == {"valid": False, "clientNumber": None}
    assert out["reset"] == {"reset": True}
    assert out["new"]["valid"] is True
    assert out["taken"].status == 409 and "register_user" in str(out["taken"])
    assert "first-Pass-1" not in str(out["taken"]) and "third-Pass-3" not in str(out["taken"])


# -- the membership state machine -------------------------------------------------------------------

# operation -> (state it needs, state it leaves)
TRANSITIONS = {
    "freeze_membership": ("Active", "Frozen"),
    "unfreeze_membership": ("Frozen", "Active"),
    "activate_membership": ("OnHold", "Active"),
    "upgrade_membership": ("Active", "Active"),
    "downgrade_membership": ("Active", "Active"),
    "cancel_membership": ("Active", "Canceled"),
}
STATES = ("Active", "Frozen", "OnHold", "Canceled")


def _transition_call(client: ServiceClient, w: World, op: str, number: str, mid: str) -> Awaitable[Any]:
    if op == "freeze_membership":
        return client.freeze_membership(clientNumber=number, membershipId=mid, freezeStartDate="2030-02-01")
    if op == "upgrade_membership":
        return client.upgrade_membership(clientNumber=number, membershipId=mid, newMembershipTypeId=w.dear)
    if op == "downgrade_membership":
        return client.downgrade_membership(clientNumber=number, membershipId=mid, newMembershipTypeId=w.cheap)
    method: Callable[..., Awaitable[Any]] = getattr(client, op)
    return method(clientNumber=number, membershipId=mid)


def test_membership_state_machine(write_sandbox: RunningSandbox) -> None:
    sb = write_sandbox

    async def body(client: ServiceClient) -> list[tuple[str, str, str, Any]]:
        w = await World(sb).load(client)
        number = await w.new_client(client)
        results: list[tuple[str, str, str, Any]] = []
        for op in TRANSITIONS:
            for state in STATES:
                mid = await w.membership(client, number, state)
                if op == "downgrade_membership" and state == "Active":  # from the dear type down
                    await client.upgrade_membership(
                        clientNumber=number, membershipId=mid, newMembershipTypeId=w.dear
                    )
                try:
                    answer = await _transition_call(client, w, op, number, mid)
                    results.append((op, state, w.status(mid), answer))
                except errors.ConflictError as exc:
                    results.append((op, state, w.status(mid), exc))
        return results

    results = using(sb, body)
    assert len(results) == len(TRANSITIONS) * len(STATES)
    for op, state, after, outcome in results:
        need, leaves = TRANSITIONS[op]
        if state == need:
            assert not isinstance(outcome, Exception), (op, state, outcome)
            assert outcome["membership"]["status"] == leaves == after, (op, state)
        else:
            assert isinstance(outcome, errors.ConflictError), (op, state, outcome)
            assert outcome.status == 409 and op in str(outcome) and outcome.code == "invalid_state"
            assert after == state  # nothing changed


def test_a_non_eft_membership_cannot_be_frozen(write_sandbox: RunningSandbox) -> None:
    sb = write_sandbox

    async def body(client: ServiceClient) -> None:
        w = await World(sb).load(client)
        number = await w.new_client(client)
        answer = await client.insert_membership(
            clientNumber=number, storecode=w.store, empNo=w.emp, membershipTypeId=w.noneft, isEft=False
        )
        await client.freeze_membership(
            clientNumber=number, membershipId=answer["membershipId"], freezeStartDate="2030-01-01"
        )

    with pytest.raises(errors.ConflictError):
        using(sb, body)


WRITE_RULES: list[tuple[str, Callable[[World, str, str], tuple[str, dict[str, Any]]]]] = [
    ("empNo", lambda w, n, m: ("insert_client", {"storecode": w.store})),
    ("storecode", lambda w, n, m: ("insert_client", {"storecode": "NOPE", "empNo": w.emp})),
    ("type", lambda w, n, m: ("update_billing_info", _billing(w, n, m, type="BITCOIN"))),
    ("deductType", lambda w, n, m: ("update_billing_info", _billing(w, n, m, deductType="NOPE"))),
    ("tokenId", lambda w, n, m: ("update_billing_info", _billing(w, n, m, tokenId=None))),
    (
        "routingNo",
        lambda w, n, m: ("update_billing_info", _billing(w, n, m, type="CHECKING", accountNo="1234567")),
    ),
    ("drawDay", lambda w, n, m: ("insert_membership", _membership(w, n, drawDay=31))),
    ("membershipTypeId", lambda w, n, m: ("insert_membership", _membership(w, n, membershipTypeId="NOPE"))),
    (
        "productNumber",
        lambda w, n, m: ("insert_transaction", _sale(w, n, {"type": "R", "pricePerUnit": "1.00"})),
    ),
    ("packageId", lambda w, n, m: ("insert_transaction", _sale(w, n, {"type": "P", "pricePerUnit": "1.00"}))),
    (
        "giftCertNo",
        lambda w, n, m: ("insert_transaction", _sale(w, n, {"type": "G", "pricePerUnit": "1.00"})),
    ),
    (
        "membershipId",
        lambda w, n, m: ("insert_transaction", _sale(w, n, {"type": "M", "pricePerUnit": "1.00"})),
    ),
    ("type", lambda w, n, m: ("insert_transaction", _sale(w, n, {"type": "X", "pricePerUnit": "1.00"}))),
    ("docId", lambda w, n, m: ("generate_web_document", {"clientNumber": n, "docId": "NOPE"})),
    (
        "amount",
        lambda w, n, m: ("insert_gift_cert", {"clientNumber": n, "storecode": w.store, "giftCertNo": "G9"}),
    ),
    ("text", lambda w, n, m: ("insert_comment", {"clientNumber": n, "empNo": w.emp})),
]


def _billing(w: World, number: str, mid: str, **changes: Any) -> dict[str, Any]:
    body = {
        "clientNumber": number,
        "membershipId": mid,
        "type": "CARD",
        "deductType": w.deduct,
        "lastFour": "4242",
        "expMonth": 1,
        "expYear": 2031,
        "tokenId": "tok_zzz",
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


def _membership(w: World, number: str, **changes: Any) -> dict[str, Any]:
    body = {
        "clientNumber": number,
        "storecode": w.store,
        "empNo": w.emp,
        "membershipTypeId": w.cheap,
        "isEft": True,
        "drawDay": w.draw_day,
    }
    return {**body, **changes}


def _sale(w: World, number: str, line: dict[str, Any]) -> dict[str, Any]:
    return {"clientNumber": number, "storecode": w.store, "empNo": w.emp, "lines": [line]}


def test_write_validation_names_the_field(write_sandbox: RunningSandbox) -> None:
    sb = write_sandbox

    async def body(client: ServiceClient) -> list[tuple[str, Any]]:
        w = await World(sb).load(client)
        number = await w.new_client(client)
        mid = await w.membership(client, number)
        outcomes: list[tuple[str, Any]] = []
        for field, make in WRITE_RULES:
            name, payload = make(w, number, mid)
            try:
                outcomes.append((field, await client.post(name, payload)))
            except errors.ServiceError as exc:
                outcomes.append((field, exc))
        return outcomes

    outcomes = using(sb, body)
    for field, outcome in outcomes:
        assert isinstance(outcome, errors.BadRequestError), (field, outcome)
        assert outcome.field == field and field in str(outcome), (field, str(outcome))
    assert sb.stats.by_status[400] == len(WRITE_RULES)  # each sent once: a 400 is never retried


# -- recovery from faults -----------------------------------------------------------------------------


def test_recovery_under_faults(fresh_sandbox: Callable[..., RunningSandbox]) -> None:
    sb = fresh_sandbox(clients=60, seed=11, fault_rate=0.05)
    numbers = sb.call(lambda s: sorted(s.clients))
    reads = ["clientdetails", "clientmemberships", "ledgerbalance", "transactionhistory", "pointsbalance"]

    async def body(client: ServiceClient) -> tuple[list[Any], dict[str, Any]]:
        calls = [getattr(client, name)(n) for n in numbers for name in reads]
        return list(await asyncio.gather(*calls)), client.stats.as_dict()

    got, stats = using(sb, body, options=ClientOptions(backoff_base=0.01, backoff_max=0.05, max_retries=8))
    truth = sb.call(lambda s: [getattr(s, name)(n) for n in numbers for name in reads])
    # ledgerbalance's asOf is today: equal unless the test straddles midnight UTC
    assert got == wire(truth)
    assert len(got) == 300
    assert stats["retries"] > 0 and stats["errors"] == 0
    assert sb.stats.faults_injected > 0


# -- a tenant whose wire names differ -------------------------------------------------------------------

TENANT = """
[params]
clientNumber = "clientNo"
lastName = "surname"
modifiedSince = "changedSince"

[paging]
page = "pageNo"
pageSize = "perPage"
totalCount = "total"
page_size = 25

[wrappers]
clientmemberships = "items"
transactionhistory = "sales"
search = "results"

[fields.clientMembership]
status = "membershipStatus"
membershipId = "id"

[fields.clientSummary]
clientNumber = "clientNo"

[fields.transaction]
receiptNumber = "receiptNo"
lines = "items"

[fields.transactionLine]
pricePerUnit = "unitPrice"

[fields.storeInfo]
storecode = "storeCode"

[fields.insert_client]
clientNumber = "clientNo"
storecode = "storeCode"
"""


def test_a_tenant_profile_works_end_to_end(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_path: Any
) -> None:
    path = tmp_path / "tenant.toml"
    path.write_text(TENANT)
    profile = Profile.load(path)
    assert not profile.is_contract
    sb = fresh_sandbox(clients=60, seed=5, profile=profile)
    numbers = sb.call(lambda s: sorted(s.clients))
    since = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

    async def body(client: ServiceClient) -> dict[str, Any]:
        out: dict[str, Any] = {"stores": await client.storelist()}
        out["memberships"] = [await client.clientmemberships(n) for n in numbers[:10]]
        out["history"] = [await client.transactionhistory(n) for n in numbers[:10]]
        out["all"] = [c["clientNumber"] async for p in client.search(modifiedSince=since) for c in p.items]
        store = out["stores"][0]["storecode"]
        emp = (await client.employees(store))[0]["empNo"]
        out["inserted"] = await client.insert_client(storecode=store, empNo=emp, lastName="Tenant")
        return out

    out = using(sb, body, profile=profile)
    assert out["stores"] == wire(sb.call(lambda s: s.storelist()))
    assert out["memberships"] == wire(sb.call(lambda s: [s.clientmemberships(n) for n in numbers[:10]]))
    assert out["history"] == wire(sb.call(lambda s: [s.transactionhistory(n) for n in numbers[:10]]))
    assert any(out["memberships"]) and any(out["history"])
    assert out["all"] == numbers
    assert set(out["inserted"]) == {"clientNumber"}
    assert sb.call(lambda s: s.clients[out["inserted"]["clientNumber"]].last_name) == "Tenant"
