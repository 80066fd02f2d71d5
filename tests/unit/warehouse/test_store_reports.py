"""Issue 51: per-store reports for store managers (``MEMBERSYNC_STORE_REPORTS``) and each store's
morning report sent to its own receivers (``MEMBERSYNC_STORE_NOTIFY``).

Real parts: the sandbox on loopback (store codes with spaces), a real ``membersync sync``, a real
HTTP receiver per store behind Apprise's ``json://``. Truth by store: the sandbox's own state
(:mod:`truth`), each store's rows only.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import openpyxl
import truth
from membersync.extract.sandbox.running import RunningSandbox
from membersync.warehouse.exports.export import REPORT_NAMES
from membersync.warehouse.landing.paths import DataDir
from nights import TONIGHT as NIGHT
from receiver import PASSWORD, USERNAME, Receiver, base_env, membersync


def store_folder(data_dir: DataDir, store: str) -> Path:
    return data_dir.reports / NIGHT.isoformat() / "stores" / quote(store, safe="")


def test_case_each_store_gets_its_own_folder_with_only_its_clients_and_one_message(
    fresh_sandbox: Callable[..., RunningSandbox],
    receiver: Receiver,  # the fixture (tests/support/receiver.py, registered in conftest)
    tmp_path: Path,
) -> None:
    """Case: three stores (storecodes with spaces), store reports on, a receiver per store given in
    a file: each folder holds its store's rows only (truth by store), each manager one message
    with their store's morning report attached."""
    sandbox = fresh_sandbox(
        clients=90, stores=3, seed=83, anchor_date=NIGHT, username=USERNAME, password=PASSWORD
    )
    stores = sorted(sandbox.call(lambda s: list(s.stores)))
    assert any(" " in s for s in stores), "a storecode with spaces: the file form must keep them"
    pairs = tmp_path / "store-receivers.txt"
    pairs.write_text(
        "# storecode=receiver, one a line\n"
        + "".join(f"{store}={receiver.url(f'/store/{i}')}\n" for i, store in enumerate(stores)),
        encoding="utf-8",
    )
    data_dir = DataDir(tmp_path / "data")
    env = base_env(
        data_dir.root,
        MEMBERSYNC_BASE_URL=sandbox.url,
        MEMBERSYNC_BUILD="on",
        MEMBERSYNC_STORE_REPORTS="on",
        MEMBERSYNC_STORE_NOTIFY=f"@{pairs}",
    )
    done = membersync("sync", "--date", NIGHT.isoformat(), "--no-progress", env=env)
    assert done.returncode == 0, done.stderr

    expected = truth.truth_of(sandbox, NIGHT)
    expected["package_liability_roll_forward"] = sandbox.call(  # the first night: the baseline
        lambda s: truth.package_roll_forward_of(s, NIGHT, None)
    )
    for store in stores:
        folder = store_folder(data_dir, store)
        names = sorted(p.name for p in folder.iterdir())
        assert len([n for n in names if n.endswith(".csv")]) == len(REPORT_NAMES)  # every report
        assert (
            f"reports_{NIGHT.isoformat()}.xlsx" in names
            and f"morning_report_{NIGHT.isoformat()}.html" in names
        )
        for name in truth.SPECS:
            _, rows = truth.read_csv(folder / f"{name}_{NIGHT.isoformat()}.csv")
            mine = [r for r in expected[name] if r["storecode"] == store]
            want = truth.expected_csv_rows(name, mine, NIGHT)
            assert truth.diff_rows(f"{store}/{name}", rows, want, truth.SPECS[name].key) == []
        # each sheet's title line names the store, by its name in the night's list and its code
        listed = sandbox.call(lambda s, store=store: s.stores[store].name)
        book = openpyxl.load_workbook(folder / f"reports_{NIGHT.isoformat()}.xlsx")
        for sheet in book.worksheets:
            title = sheet.cell(1, 1).value
            assert title == f"{sheet.title} \u2014 {listed} ({store.rstrip()}) \u2014 night of {NIGHT}", title
        others = {r["client_number"] for r in expected["top_debtors"] if r["storecode"] != store}
        ranked = [r["client_number"] for r in expected["top_debtors"] if r["storecode"] == store]
        html = (folder / f"morning_report_{NIGHT.isoformat()}.html").read_text(encoding="utf-8")
        assert not ranked or f"({ranked[0]})" in html  # the store's largest debtor is named
        named = [n for n in others - set(ranked) if f"({n})" in html]
        assert not named, f"another store's client is named in {store!r}'s report: {named}"

    assert sorted(m.path for m in receiver.got) == sorted(f"/store/{i}" for i in range(len(stores)))
    for message in receiver.got:
        store = stores[int(message.path.rsplit("/", 1)[1])]
        body = message.json
        assert store.rstrip() in body["title"] and body["type"] == "info"
        (attached,) = body["attachments"]
        html = store_folder(data_dir, store) / f"morning_report_{NIGHT.isoformat()}.html"
        assert base64.b64decode(attached["base64"]) == html.read_bytes()
        assert json.dumps(body).count("morning report") >= 1


def test_a_malformed_store_receiver_setting_is_one_line_exit_2(tmp_path: Path) -> None:
    env = base_env(
        tmp_path / "data", MEMBERSYNC_BASE_URL="http://127.0.0.1:9", MEMBERSYNC_STORE_NOTIFY="DOWNTOWN"
    )
    done = membersync("sync", "--no-progress", env=env)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "MEMBERSYNC_STORE_NOTIFY" in lines[0] and "storecode=URL" in lines[0], (
        done.stderr
    )
