"""The build's memory bound (warehouse/build/memory.py): the setting, the batches of a refresh,
and DuckDB held to it."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from membersync.extract.settings import Settings, SettingsError, parse_size
from membersync.warehouse.build import memory
from membersync.warehouse.build.memory import MIB, MemoryBound, batch_nights, bound_connection, build_memory
from membersync.warehouse.landing.paths import DataDir

GIB = 1024 * MIB


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2GB", 2 * 10**9), ("1.5GiB", 3 * GIB // 2), ("800mb", 800 * 10**6), ("40%", 40), ("4096", 4096)],
)
def test_case_sizes_are_read_in_decimal_and_binary_units_and_as_a_share(text: str, expected: int) -> None:
    assert parse_size(text, 100) == expected


@pytest.mark.parametrize("text", ["2 lots", "GB", "-1GB", "0", "1e9", "150%"])
def test_case_a_bad_size_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.load({"MEMBERSYNC_BUILD_MEMORY": text})
    message = str(caught.value)
    assert message.startswith("MEMBERSYNC_BUILD_MEMORY: ") and "\n" not in message
    assert "expected a size" in message or "at most 100%" in message


def test_case_a_bound_too_small_for_duckdb_is_refused(tmp_path: Path) -> None:
    settings = Settings.load({"MEMBERSYNC_BUILD_MEMORY": "600MiB"})
    with pytest.raises(SettingsError, match="MEMBERSYNC_BUILD_MEMORY: 600 MiB is below the 768 MiB"):
        build_memory(DataDir(tmp_path), settings=settings)


def test_case_unset_the_bound_is_half_of_what_the_process_can_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "machine_memory", lambda: 8 * GIB)
    bound = build_memory(DataDir(tmp_path), settings=Settings.load({}))
    assert bound.total == 4 * GIB and bound.duckdb_limit == 3 * GIB  # DuckDB's share, 3/4
    assert bound.settings()["memory_limit"] == "3072MiB"
    assert bound.spill_dir == tmp_path / "warehouse" / "spill" / memory.BUILD_SPILL


def test_case_a_cgroup_v1_limit_is_read_from_this_process_s_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit of the group /proc/self/cgroup names (a container's), not the hierarchy's root."""
    group = tmp_path / "sys/fs/cgroup/memory/pool/tenant-7"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("9:name=systemd:/\n4:memory:/pool/tenant-7\n0::/\n")
    real = Path

    def rooted(*parts: object) -> Path:
        path = real(*parts)  # type: ignore[arg-type]
        if str(path) == "/proc/self/cgroup":
            return proc
        if str(path).startswith("/sys/fs/cgroup"):
            return tmp_path / str(path).lstrip("/")
        return path

    monkeypatch.setattr(memory, "Path", rooted)
    assert memory._cgroup_limit() == 2 * GIB


def bound(limit: int) -> MemoryBound:
    """A bound whose DuckDB limit is ``limit``."""
    total = max(limit + memory.PROCESS_RESERVE, -(-limit * 4 // 3))
    made = MemoryBound(total, Path("/nowhere"))
    assert made.duckdb_limit == limit
    return made


def test_case_a_history_that_fits_is_one_batch() -> None:
    assert batch_nights([10 * MIB] * 365, bound(365 * 10 * MIB * memory.EXPANSION)) == [365]


def test_case_batches_keep_their_landed_bytes_under_the_limit_over_the_expansion() -> None:
    sizes = [10 * MIB] * 100
    batches = batch_nights(sizes, bound(200 * MIB * memory.EXPANSION))  # 20 nights a batch
    assert batches == [20] * 5 and sum(batches) == len(sizes)


def test_case_a_night_larger_than_a_batch_is_built_alone() -> None:
    sizes = [MIB, 50 * MIB, MIB, MIB]
    assert batch_nights(sizes, bound(10 * MIB * memory.EXPANSION)) == [1, 1, 2]


def test_case_a_fixed_batch_size_cuts_the_nights_in_order() -> None:
    assert batch_nights([1] * 10, bound(GIB), fixed=4) == [4, 4, 2]
    assert batch_nights([], bound(GIB), fixed=4) == []


def test_case_a_bound_connection_holds_duckdb_to_the_limit_and_spills_in_the_work_area(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case: a sort of more rows than the limit holds finishes (spilled), in the data dir's spill
    folder (owner-only), under the limit the setting gives."""
    monkeypatch.setenv("MEMBERSYNC_BUILD_MEMORY", "800MiB")
    data_dir = DataDir(tmp_path)
    with bound_connection(data_dir) as con:
        limit = con.execute("SELECT current_setting('memory_limit')").fetchone()
        spill = con.execute("SELECT current_setting('temp_directory')").fetchone()
        con.execute("SET threads = 1")
        query = "SELECT count(*) FROM (SELECT md5(i::VARCHAR) h FROM range(4000000) t(i) ORDER BY h)"
        assert con.execute(query).fetchone() == (4000000,)
    assert limit == ("288.0 MiB",)  # 800 MiB less the process reserve
    assert spill is not None and Path(spill[0]).parent == tmp_path / "warehouse" / "spill"
    assert (Path(spill[0]).stat().st_mode & 0o777) == 0o700


def test_case_the_build_profile_gives_dbt_the_same_bound(tmp_path: Path) -> None:
    from membersync.warehouse.build import dbt_run

    bound = MemoryBound(GIB, tmp_path / "spill")
    dbt_run.write_profile(tmp_path, tmp_path / "scratch.duckdb", 2, bound.settings())
    output = json.loads((tmp_path / "profiles.yml").read_text())["membersync"]["outputs"]["build"]
    assert output["config_options"] == {
        "memory_limit": f"{(GIB - memory.PROCESS_RESERVE) // MIB}MiB",
        "temp_directory": str(tmp_path / "spill"),
    }
    # DuckDB's own option names and values: a database opens with them
    with duckdb.connect(str(tmp_path / "scratch.duckdb"), config=output["config_options"]) as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchone() == ("512.0 MiB",)
