"""A tenant whose server differs from the contract, synced through landing, the warehouse and the
reports (issue 53, defect 3): the sandbox serves the tenant's wire names, and ``membersync sync``
reads them through ``MEMBERSYNC_PROFILE`` alone.

The profile differs in everything a profile can say: 0-based paging with a page of 7 (so the
client list is many pages, the last one short), renamed query parameters (the client number, the
dates, the change window), renamed wrapper keys and renamed item fields (a membership's status and
dues, a sale's receipt number and lines, a line's price and amount, a ledger's balance). A full
night and an incremental one (after ordinary changes) must each equal the truth computed in plain
Python from the sandbox's own state (``tests/support/truth.py``), every report, warehouse and CSV.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import truth
from landed import synced_numbers
from membersync.extract.profile import Profile
from membersync.extract.sandbox.running import RunningSandbox
from nights import LAST_NIGHT as ANCHOR
from reliability import Workspace

NIGHT1, NIGHT2 = ANCHOR, ANCHOR + dt.timedelta(days=1)

TENANT = """
[params]
clientNumber = "clientNo"
startDate = "from"
endDate = "to"
modifiedSince = "changedSince"

[paging]
page = "pageIndex"
pageSize = "perPage"
totalCount = "total"
first_page = 0
page_size = 7
max_page_size = 7

[wrappers]
clientmemberships = "items"
transactionhistory = "sales"
ledgerbalance = "ledger"
search = "results"

[fields.clientMembership]
status = "membershipStatus"
membershipId = "id"
monthlyDues = "dues"

[fields.clientSummary]
clientNumber = "clientNo"

[fields.transaction]
receiptNumber = "receiptNo"
lines = "items"

[fields.transactionLine]
pricePerUnit = "unitPrice"
amount = "lineTotal"

[fields.ledgerBalance]
balance = "amountDue"

[fields.storeInfo]
storecode = "storeCode"
"""


def ordinary_changes(sandbox: RunningSandbox) -> list[str]:
    """A day's changes at the vendor: a payment on each of three debtors' ledgers; returns the
    clients changed."""

    def write(service: Any) -> list[str]:
        listed = service.store_payment_types  # a ledger may be at a storecode outside the list
        owing = {
            number: code
            for number, client in sorted(service.clients.items())
            for code, balance in client.ledger.items()
            if balance > 0 and code in listed
        }
        debtors = sorted(owing)[:3]
        for number in debtors:
            code = owing[number]
            service.post_account_ledger_payment(
                {
                    "clientNumber": number,
                    "storecode": code,
                    "amount": "1.00",
                    "paymentType": listed[code][0].code,
                }
            )
        return debtors

    return sandbox.call(write)


def test_case_a_tenant_with_other_wire_names_is_exact_after_a_full_and_an_incremental_night(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_path: Path
) -> None:
    profile_path = tmp_path / "tenant.toml"
    profile_path.write_text(TENANT)
    profile = Profile.load(profile_path)
    assert profile.first_page == 0 and profile.page_size == 7 and not profile.is_contract
    sandbox = fresh_sandbox(clients=45, stores=3, seed=19, anchor_date=ANCHOR, profile=profile)
    env = {"MEMBERSYNC_PROFILE": str(profile_path)}
    ws = Workspace(tmp_path / "ws", sandbox.url, ANCHOR, batch_size=10, extra_env=env)

    first = ws.sync(ws.argv(NIGHT1))
    assert first.ok, first.describe()
    assert first.summary_value("mode") == "full"
    every = sandbox.call(lambda s: set(s.clients))
    assert set(synced_numbers(ws.data_dir, NIGHT1)) == every  # all 7 pages of the client list
    night1 = truth.assert_night_exact(sandbox, ws.data_dir, NIGHT1)
    assert any(r["amount_owed"] > Decimal(0) for r in night1["outstanding_balances_by_store"])

    changed = ordinary_changes(sandbox)
    second = ws.sync(ws.argv(NIGHT2))
    assert second.ok, second.describe()
    assert second.summary_value("mode") == "incremental"
    assert set(changed) <= set(synced_numbers(ws.data_dir, NIGHT2)) < every
    night2 = truth.assert_night_exact(sandbox, ws.data_dir, NIGHT2)
    assert night2["outstanding_balances_by_store"] != night1["outstanding_balances_by_store"]
