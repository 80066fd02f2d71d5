"""A night against the sandbox, shared by the tests that run one: settings, a subprocess's
environment, and the rows each table must hold after a full night (the sandbox's own state)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from membersync.extract.settings import ServiceSettings
from pydantic import SecretStr

# "Tonight", as the CLI means it: its default night is this machine's local date, and a night is
# never in the future. Every test that syncs tonight (or last night) takes it from here: a UTC
# date was "tomorrow" to the CLI for part of the day west of UTC.
TONIGHT = dt.date.today()
LAST_NIGHT = TONIGHT - dt.timedelta(days=1)


def settings_for(sandbox: Any) -> ServiceSettings:
    config = sandbox.config if hasattr(sandbox, "config") else None
    username = getattr(config, "username", "sandbox")
    password = getattr(config, "password", "sandbox")
    return ServiceSettings(sandbox.url, SecretStr(username), SecretStr(password))


def sync_env(sandbox: Any, data_dir: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    settings = settings_for(sandbox)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMBERSYNC_", "PREFECT_"))}
    env.update(
        MEMBERSYNC_BASE_URL=settings.base_url,
        MEMBERSYNC_USERNAME=settings.username.get_secret_value(),
        MEMBERSYNC_PASSWORD=settings.password.get_secret_value(),
        MEMBERSYNC_DATA_DIR=str(data_dir),
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        COLUMNS="200",
        **extra,
    )
    return env


# --- ground truth ---------------------------------------------------------------------------------


def truth_counts(service: Any) -> dict[str, int]:
    """Rows each table must hold after a full night, from the sandbox's own state."""
    service.materialize_all()
    clients = list(service.clients.values())
    shared_views = sum(len(v) for v in service.shares.values())
    return {
        "stores": len(service.stores),
        "sellable_packages": len(service.package_types),
        "eft_membership_types": len(service.eft_types),
        "noneft_membership_types": len(service.noneft_types),
        "eft_deduct_types": len(service.deduct_types),
        "eft_draw_days": len(service.draw_days),
        "skin_types": len(service.skin_type_codes),
        "web_docs": len(service.webdoc_names),
        "payment_types": sum(len(v) for v in service.store_payment_types.values()),
        "employees": sum(e.active for v in service.store_employees.values() for e in v),  # active only
        "products": sum(len(v) for v in service.store_products.values()),
        "processor_credentials": len(service.credentials),
        "profile_questions": len(service.questions),
        "synced_clients": len(clients),
        "clients": len(clients),
        "client_identity": len(clients),  # every client is new on a first night: one identity each
        "client_demographics": len(clients),
        "comm_prefs": len(clients),
        "ledger_balances": sum(len(c.ledger) for c in clients),
        "points_balances": sum(len(c.points) for c in clients),
        "memberships": len(service.memberships),
        "client_packages": sum(len(c.packages) for c in clients) + shared_views,
        "billing_accounts": len(service.billing_accounts),
        "affiliated_package_clients": shared_views,
        "points_transactions": sum(len(c.points_transactions) for c in clients),
        "transactions": len(service.transactions),
        "transaction_lines": sum(len(t.lines) for t in service.transactions.values()),
        "transaction_payments": sum(len(t.payments) for t in service.transactions.values()),
    }
