"""The incremental build (issue 10): each night built on its own equals a full refresh, byte for
byte, after late corrections; a SIGKILL anywhere in a build leaves the previous warehouse whole.

The nights come from the synthetic history (real landing code, no HTTP). The late correction is
made on purpose, not left to chance: a sale from before the first night is voided on night 3 and
its client synced that night, and the test checks the correction really changed a report.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from membersync.flows.benchmarks.synthetic import FIRST_NIGHT, STORES, History, Sale, land_night
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.build.catalog import parts_dir, warehouse_dir
from membersync.warehouse.build.publish import TMP_PREFIX
from membersync.warehouse.exports.export import REPORT_NAMES, export_reports
from membersync.warehouse.landing.paths import DataDir
from repo_root import REPO

CLIENTS = 40
NIGHTS = 4


def _night(index: int) -> dt.date:
    return FIRST_NIGHT + dt.timedelta(days=index)


def _old_sale(history: History) -> Sale:
    """The sale the test voids on night 2: one from before the first night, still saved."""
    return next(
        s for c in history.clients for s in c.sales if s.when.date() < FIRST_NIGHT and s.status == "Saved"
    )


def _land(data_dir: DataDir, history: History, index: int, late_void: Sale) -> None:
    """Land night ``index`` (0: every client); night 2 also voids ``late_void`` (a late correction)."""
    night = _night(index)
    if index == 0:
        land_night(data_dir, history, night, history.clients, full=True)
        return
    synced = history.rng.sample(history.clients, 8)
    for client in synced:
        history.change(client, night)
    if index == 2:
        late_void.status = "Voided"
        owner = next(c for c in history.clients if late_void in c.sales)
        synced = [c for c in synced if c is not owner] + [owner]  # the vendor changed the client
    land_night(data_dir, history, night, synced, full=False)


def _exports(data_dir: DataDir) -> dict[str, bytes]:
    """Every report of every night (CSVs and workbooks), as bytes."""
    out = {}
    for index in range(NIGHTS):
        for path in export_reports(data_dir, _night(index)):
            out[path.name] = path.read_bytes()
    return out


def _parts_of(catalog: bytes) -> list[str]:
    """The parts a catalog (its file's bytes) names."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "catalog.duckdb"
        path.write_bytes(catalog)
        with duckdb.connect(str(path), read_only=True) as con:
            return [r[0] for r in con.execute("SELECT path FROM meta.parts").fetchall()]


def _revenue_of_day(data_dir: DataDir, day: dt.date) -> list[tuple]:
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        return con.execute(
            "SELECT storecode, type, transactions, amount FROM reports.revenue_by_store_day "
            "WHERE business_date = ? ORDER BY ALL",
            [day],
        ).fetchall()


EVENT_MARTS = {  # storage latest: each build stores the versions that changed
    "marts.transactions": "receipt_number",
    "marts.transaction_lines": "receipt_number, line_no",
    "marts.transaction_payments": "payment_id",
    "marts.points_transactions": "points_transaction_id",
    "marts.sales_lines": "receipt_number, line_no",
}


def _event_marts(data_dir: DataDir) -> dict[str, list[tuple]]:
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        return {name: con.execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall() for name in EVENT_MARTS}


def _stored_transaction_versions(data_dir: DataDir) -> set[tuple[str, dt.date]]:
    """(receipt, night) of every row the builds stored in marts.transactions' parts."""
    folder = parts_dir(data_dir) / "marts.transactions"
    table = pq.read_table(sorted(folder.glob("*.parquet")), columns=["receipt_number", "snapshot_date"])
    rows = zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True)
    return set(rows)


def _transaction_change_points(data_dir: DataDir) -> set[tuple[str, dt.date]]:
    """The truth, from the landed files alone: (receipt, night) where a receipt was first landed
    or landed with another status than the night it was last landed before."""
    # the night from the partition folder (snapshot_date=...): no crash here leaves an orphan
    landed = pq.read_table(
        data_dir.landing / "transactions", columns=["receipt_number", "snapshot_date", "status"]
    )
    versions = sorted(zip(*(landed.column(c).to_pylist() for c in landed.column_names), strict=True))
    points, last = set(), {}
    for receipt, night, status in versions:
        if last.get(receipt) != status:
            points.add((receipt, dt.date.fromisoformat(str(night))))
        last[receipt] = status
    return points


def test_incremental_nights_equal_a_full_refresh_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cases: each night built on its own; the whole rebuilt at once; the whole rebuilt in batches
    of three nights then one (the bounded-memory refresh): every report of every night the same."""
    data_dir = DataDir(tmp_path / "data")
    history = History(CLIENTS, seed=11)
    late_void = _old_sale(history)
    day = late_void.when.date()
    revenue = {}
    for index in range(NIGHTS):
        _land(data_dir, history, index, late_void)
        result = build_warehouse(data_dir)
        # Each night after the first is built on its own, continuing from the published state.
        assert result.built_nights == (_night(index),)
        assert result.full_refresh == (index == 0)
        assert result.checks > 50  # dbt tests (meta.checks lists the checks per model)
        revenue[index] = _revenue_of_day(data_dir, day)
    # Not by coincidence: the late void changed the revenue of a day long before night 2.
    assert revenue[1] != revenue[2] and revenue[2] == revenue[3]
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        status = con.execute(
            "SELECT status FROM marts.transactions WHERE receipt_number = ?", [late_void.receipt]
        ).fetchall()
    assert status == [("voided",)]
    # Each build stored only what changed: the receipts first landed, and the late void, on the
    # night they changed (not every re-fetched receipt of every synced client).
    stored = _stored_transaction_versions(data_dir)
    assert stored == _transaction_change_points(data_dir)
    assert (late_void.receipt, _night(2)) in stored
    events = _event_marts(data_dir)
    incremental = _exports(data_dir)
    assert len(incremental) == NIGHTS * (len(REPORT_NAMES) + 1)

    result = build_warehouse(data_dir, full_refresh=True)
    assert result.full_refresh and result.built_nights == tuple(_night(i) for i in range(NIGHTS))
    full = _exports(data_dir)
    assert _event_marts(data_dir) == events  # the same rows, dated the same way
    assert full.keys() == incremental.keys()
    different = sorted(name for name in full if full[name] != incremental[name])
    assert not different, f"incremental and full refresh differ: {different}"

    monkeypatch.setenv("MEMBERSYNC_BUILD_BATCH_NIGHTS", "3")
    result = build_warehouse(data_dir, full_refresh=True)
    assert result.full_refresh and result.batches == 2 and len(result.built_nights) == NIGHTS
    batched = _exports(data_dir)
    assert _event_marts(data_dir) == events
    different = sorted(name for name in full if full[name] != batched[name])
    assert not different, f"a batched and a whole full refresh differ: {different}"


def _land_owner(data_dir: DataDir, history: History, index: int, sale: Sale, status: str) -> None:
    """Land night ``index`` with ``sale`` set to ``status`` (its owner synced, with a few others)."""
    sale.status = status
    owner = next(c for c in history.clients if sale in c.sales)
    synced = [c for c in history.rng.sample(history.clients, 6) if c is not owner]
    for client in synced:
        history.change(client, _night(index))
    land_night(data_dir, history, _night(index), [*synced, owner], full=False)


def test_case_a_void_undone_within_a_build_of_two_nights_is_dated_like_a_full_refresh(tmp_path: Path) -> None:
    """A -> B -> A: a sale voided on night 1 and restored on night 2, both in one catch-up build
    (nights 1 and 2), then a night on its own. The restore is a change (dated night 2), the
    event marts equal a full refresh's, and the parts hold no version the views do not need."""
    data_dir = DataDir(tmp_path / "data")
    history = History(CLIENTS, seed=5)
    sale = _old_sale(history)
    land_night(data_dir, history, _night(0), history.clients, full=True)
    build_warehouse(data_dir)
    _land_owner(data_dir, history, 1, sale, "Voided")
    _land_owner(data_dir, history, 2, sale, "Saved")
    result = build_warehouse(data_dir)
    assert result.built_nights == (_night(1), _night(2)) and not result.full_refresh
    _land_owner(data_dir, history, 3, sale, "Saved")  # fetched again, unchanged
    assert build_warehouse(data_dir).built_nights == (_night(3),)
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        row = con.execute(
            "SELECT status, snapshot_date FROM marts.transactions WHERE receipt_number = ?", [sale.receipt]
        ).fetchall()
    assert row == [("saved", _night(2))]  # restored on night 2; night 3's fetch changed nothing
    # What the builds stored: the sale's night-0 version and its night-2 one (the night-1 void
    # is inside the two-night build, whose newest version is night 2's).
    stored = {night for receipt, night in _stored_transaction_versions(data_dir) if receipt == sale.receipt}
    assert stored == {_night(0), _night(2)}
    events = _event_marts(data_dir)
    build_warehouse(data_dir, full_refresh=True)
    assert _event_marts(data_dir) == events


def _revenue_truth(history: History) -> list[tuple]:
    """reports.revenue_by_store_day from the generator's state alone (plain Python, Decimal):
    every sale not voided, by its store, its day and line type."""
    groups: dict[tuple, list] = {}
    for client in history.clients:
        for sale in client.sales:
            if sale.status == "Voided":
                continue
            for line_type, quantity, price in sale.lines:
                group = groups.setdefault((sale.storecode, sale.when.date(), line_type), [set(), 0, 0, 0])
                group[0].add(sale.receipt)
                group[1] += quantity
                group[2] += price * quantity
                group[3] += (price * quantity * Decimal("0.08")).quantize(Decimal("0.01"))
    return sorted((*key, len(g[0]), g[1], g[2], g[3]) for key, g in groups.items())


def _revenue(data_dir: DataDir) -> list[tuple]:
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        return con.execute(
            "SELECT storecode, business_date, type, transactions, quantity, amount, tax "
            "FROM reports.revenue_by_store_day ORDER BY ALL"
        ).fetchall()


def test_case_a_sale_moved_to_another_day_and_store_leaves_its_old_group(tmp_path: Path) -> None:
    """A correction moves an old sale to another day and store (night 1), then voids another
    sale (night 2): the incremental revenue report recomputes the old and the new (store, day)
    groups, equal to the truth from the generator's state and to a full refresh."""
    data_dir = DataDir(tmp_path / "data")
    history = History(CLIENTS, seed=11)
    moved = _old_sale(history)
    old_group = (moved.storecode, moved.when.date())
    land_night(data_dir, history, _night(0), history.clients, full=True)
    build_warehouse(data_dir)
    assert any(row[:2] == old_group for row in _revenue(data_dir))
    moved.when -= dt.timedelta(days=3)
    moved.storecode = next(s for s in STORES if s != moved.storecode)
    _land_owner(data_dir, history, 1, moved, "Saved")
    assert not build_warehouse(data_dir).full_refresh
    incremental = _revenue(data_dir)
    assert incremental == _revenue_truth(history)
    voided = next(s for c in history.clients for s in c.sales if s.status == "Saved" and s is not moved)
    _land_owner(data_dir, history, 2, voided, "Voided")
    build_warehouse(data_dir)
    incremental = _revenue(data_dir)
    assert incremental == _revenue_truth(history)
    build_warehouse(data_dir, full_refresh=True)
    assert _revenue(data_dir) == incremental


CRASHER = (
    "import sys, pathlib\n"
    "from membersync.warehouse.build.builder import build_warehouse\n"
    "from membersync.warehouse.landing.paths import DataDir\n"
    "build_warehouse(DataDir(pathlib.Path(sys.argv[1])), full_refresh=sys.argv[2:] == ['full'])\n"
)


def test_sigkill_half_way_through_a_batched_refresh_keeps_the_previous_warehouse(tmp_path: Path) -> None:
    """Case: a full refresh in batches of two nights killed after its first batch; readers keep
    the previous warehouse meanwhile; the rerun refreshes it exactly and leaves no batch behind."""
    data_dir = DataDir(tmp_path / "data")
    history = History(CLIENTS, seed=5)
    late_void = _old_sale(history)
    for index in range(NIGHTS):
        _land(data_dir, history, index, late_void)
    build_warehouse(data_dir)
    before = data_dir.warehouse_db.read_bytes()
    reports_before = _exports(data_dir)

    env = {**os.environ, "MEMBERSYNC_CRASH_AT": "after_refresh_batch:1", "MEMBERSYNC_BUILD_BATCH_NIGHTS": "2"}
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(data_dir.root), "full"], env=env, cwd=REPO)
    assert proc.wait(timeout=300) == -9
    killed = [p for p in parts_dir(data_dir).glob("*/*.parquet") if f"-{proc.pid}-" in p.name]
    assert killed, "the killed refresh had written a batch's parts (so it died half-way)"
    assert data_dir.warehouse_db.read_bytes() == before
    assert _exports(data_dir) == reports_before

    env.pop("MEMBERSYNC_CRASH_AT")
    rerun = subprocess.run([sys.executable, "-c", CRASHER, str(data_dir.root), "full"], env=env, cwd=REPO)
    assert rerun.returncode == 0
    assert _exports(data_dir) == reports_before  # exact: what a whole refresh (and each night) gives
    assert not [p for p in parts_dir(data_dir).glob("*/*.parquet") if f"-{proc.pid}-" in p.name]
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        named = {r[0] for r in con.execute("SELECT path FROM meta.parts").fetchall()}
        facts = dict(con.execute("SELECT key, value FROM meta.build").fetchall())
    assert facts["full_refresh"] == "true"
    # the refresh's two batches left only parts its catalog names (and the replaced one's)
    assert {str(p) for p in parts_dir(data_dir).glob("*/*.parquet")} - named <= set(_parts_of(before))


@pytest.mark.parametrize("nth", [1, 20])
def test_sigkill_during_a_build_leaves_the_previous_warehouse_whole(tmp_path: Path, nth: int) -> None:
    """Killed right after dbt ran (1), or while the parts are written (20)."""
    data_dir = DataDir(tmp_path / "data")
    history = History(CLIENTS, seed=3)
    late_void = _old_sale(history)
    _land(data_dir, history, 0, late_void)
    build_warehouse(data_dir)
    before = data_dir.warehouse_db.read_bytes()
    reports_before = {p.name: p.read_bytes() for p in export_reports(data_dir)}
    _land(data_dir, history, 1, late_void)

    env = {**os.environ, "MEMBERSYNC_CRASH_AT": f"during_warehouse_build:{nth}"}
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(data_dir.root)], env=env, cwd=REPO)
    assert proc.wait(timeout=300) == -9
    # The previous warehouse, whole: the same file, and it answers as before.
    assert data_dir.warehouse_db.read_bytes() == before
    assert {p.name: p.read_bytes() for p in export_reports(data_dir)} == reports_before
    left = list(warehouse_dir(data_dir).glob("scratch*"))
    assert left, "the killed build left its scratch database (so the kill was mid-build)"
    killed = [p for p in parts_dir(data_dir).glob("*/*.parquet") if f"-{proc.pid}-" in p.name]
    assert killed if nth == 20 else not killed

    # The next build finishes the night and clears what the killed one left.
    result = build_warehouse(data_dir)
    assert result.built_nights == (_night(1),) and not result.full_refresh
    assert not list(data_dir.root.glob(f"{TMP_PREFIX}*"))
    assert not list(warehouse_dir(data_dir).glob("scratch*"))
    assert not [p for p in parts_dir(data_dir).glob("*/*.parquet") if f"-{proc.pid}-" in p.name]
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        named = {r[0] for r in con.execute("SELECT path FROM meta.parts").fetchall()}
        nights = con.execute("SELECT count(*) FROM marts.nights").fetchone()
    assert named <= {str(p) for p in parts_dir(data_dir).glob("*/*.parquet")}
    assert nights == (2,)
