"""Canary clients: values no generated client has, so a hit anywhere is theirs (issues 51, 59).

:func:`add_canaries` writes three of them into a sandbox; :func:`plant_identity_elsewhere` puts
alpha's identity where a vendor may put it beyond the contract: nested in a record's fields,
on another client's records (a household member, a payer), and in text staff type (a points
transaction's reason, a sale line's description).
"""

from __future__ import annotations

from typing import Any

from membersync.extract.sandbox.running import RunningSandbox
from privacy_scan import Canary

# Values no generated client has: a hit anywhere is this client's.
IDENTITIES = {
    "alpha": {
        "firstName": "Quenbyalpha",
        "lastName": "Zephyrcanary",
        "email": "quenby.alpha.canary@example.test",
        "phone": "555-0142-9931",
        "address1": "9 Canaryalpha Wharf Row",
        "birthDate": "1981-04-17",
        "postalCode": "K9Z 7Q1",
    },
    "beta": {
        "firstName": "Ottilabeta",
        "lastName": "Marrowcanary",
        "email": "ottila.beta.canary@example.test",
        "phone": "555-0177-4410",
        "address1": "41 Canarybeta Close",
        "birthDate": "1990-12-02",
        "postalCode": "J3X 2W8",
    },
    "control": {  # never forgotten: the scan's positive control
        "firstName": "Wendelcontrol",
        "lastName": "Harrowcanary",
        "email": "wendel.control.canary@example.test",
        "phone": "555-0199-2207",
        "address1": "3 Canarycontrol Yard",
        "birthDate": "1975-06-30",
        "postalCode": "T5K 0A9",
    },
}
SEARCHED = ("firstName", "lastName", "email", "phone", "address1")


def add_canaries(sandbox: RunningSandbox) -> dict[str, Canary]:
    """Three clients with unique identities, each owing a large amount at the first store (so
    they head its top-debtors list, in every report format), beta referred by alpha."""

    def write(service: Any) -> dict[str, str]:
        store = sorted(service.stores)[0]
        emp = next(e.emp_no for e in service.store_employees[store] if e.active)
        product = service.store_products[store][0].product_number
        numbers: dict[str, str] = {}
        for rank, (name, identity) in enumerate(IDENTITIES.items()):
            body = {"storecode": store, "empNo": emp, **identity}
            if name == "beta":
                body["referredBy"] = numbers["alpha"]
            number = service.insert_client(body)["clientNumber"]
            line = {
                "type": "R",
                "productNumber": product,
                "quantity": 1,
                "pricePerUnit": f"{90000 - rank}.00",
                "tax": "0",
            }
            service.insert_transaction(
                {"clientNumber": number, "storecode": store, "empNo": emp, "lines": [line]}
            )
            numbers[name] = number
        return numbers

    numbers = sandbox.call(write)
    return {name: Canary(numbers[name], tuple(IDENTITIES[name][k] for k in SEARCHED)) for name in IDENTITIES}


def plant_identity_elsewhere(sandbox: RunningSandbox, canaries: dict[str, Canary]) -> None:
    """Alpha named beyond its own record's contract fields (see the module's docstring)."""
    alpha = IDENTITIES["alpha"]
    numbers = {name: c.number for name, c in canaries.items()}
    full_name = f"{alpha['firstName']} {alpha['lastName']}"

    def write(service: Any) -> None:
        store = sorted(service.stores)[0]
        emp = next(e.emp_no for e in service.store_employees[store] if e.active)
        product = service.store_products[store][0].product_number
        control = numbers["control"]
        service.insert_points(
            {
                "clientNumber": control,
                "storecode": store,
                "points": 25,
                "reason": f"referral bonus: {full_name} <{alpha['email']}>",
            }
        )
        line = {
            "type": "R",
            "productNumber": product,
            "quantity": 1,
            "pricePerUnit": "10.00",
            "tax": "0",
            "description": f"Gift for {alpha['lastName']}, call {alpha['phone'].replace('-', ' ')}",
        }
        service.insert_transaction(
            {"clientNumber": control, "storecode": store, "empNo": emp, "lines": [line]}
        )
        fields = service.tenant_fields
        fields[("clientdetails", numbers["alpha"])] = {
            "emergencyContact": {"name": "Ingridkin Alphahouse", "phone": alpha["phone"]}
        }
        fields[("clientdetails", control)] = {"household": [{"name": full_name, "relation": "partner"}]}
        fields[("transactionhistory", control)] = {
            "paidBy": {"clientName": full_name, "email": alpha["email"]},
            "note": f"paid by {alpha['firstName']} at the desk",
        }
        fields[("clientmemberships", numbers["alpha"])] = {
            "accountHolder": {"firstName": alpha["firstName"], "lastName": alpha["lastName"]}
        }
        service.touch(service.clients[control])
        service.touch(service.clients[numbers["alpha"]])

    sandbox.call(write)
