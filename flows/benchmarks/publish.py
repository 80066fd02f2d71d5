"""Benchmark of the PostgreSQL publication (not a test): a night's incremental publish against
the night's own build, and ``--full`` of the whole history.

The history is landed first by :mod:`membersync.flows.benchmarks.synthetic`; the database is any
PostgreSQL the URL names (a throwaway one: every published schema is dropped and made again)::

    python -m membersync.flows.benchmarks.synthetic DIR --clients 10000 --nights 365 --rate 0.05
    python -m membersync.flows.benchmarks.publish DIR --url postgresql://me@127.0.0.1:5432/bench

Steps, each timed: the warehouse built from every night but the newest (its manifest set aside),
``publish --full`` of those nights (one transaction), the newest night's manifest back and its
incremental build, then that night's incremental publish (one transaction). Printed: seconds,
rows and bytes sent (CSV) of each publish, and the night's publish as a share of its build, its
seconds by kind of table, and a floor: the seconds DuckDB alone takes to read every table kept
whole (views over the history: a publication that sent only their changed rows would still
read them all to find which changed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from membersync.flows.console import out
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.postgres import Publication, publish_warehouse, published_tables
from membersync.warehouse.landing.paths import DataDir


def _newest_manifest(data_dir: DataDir) -> Path:
    return sorted(data_dir.manifests.glob("????-??-??.json"))[-1]


def _timed_build(data_dir: DataDir) -> float:
    started = time.perf_counter()
    build_warehouse(data_dir)
    return time.perf_counter() - started


def _line(what: str, done: Publication) -> str:
    return (
        f"{what}: {len(done.nights)} night(s) in {done.seconds:.2f} s, "
        f"{done.rows:,} rows, {done.bytes / 1e6:,.1f} MB sent"
    )


def _read_whole_tables(data_dir: DataDir) -> dict[str, float]:
    """Seconds to read each table the publication keeps whole, in DuckDB alone (the floor)."""
    import duckdb

    con = duckdb.connect(str(data_dir.identified_db), read_only=True)
    seconds: dict[str, float] = {}
    try:
        for table in published_tables(con):
            if table.kind == "whole":
                started = time.perf_counter()
                for _batch in con.sql(f"select * from {table.name}").to_arrow_reader(100_000):
                    pass
                seconds[table.name] = time.perf_counter() - started
        return seconds
    finally:
        con.close()


def run(root: Path, url: str) -> int:
    os.environ["MEMBERSYNC_PREFECT"] = "off"
    data_dir = DataDir(root)
    newest = _newest_manifest(data_dir)
    aside = newest.with_suffix(".aside")
    shutil.move(newest, aside)
    try:
        history = _timed_build(data_dir)
        full = publish_warehouse(data_dir, url=url, full=True)
    finally:
        shutil.move(aside, newest)
    night = _timed_build(data_dir)
    one = publish_warehouse(data_dir, url=url)
    out.print(f"build of {len(full.nights)} nights: {history:.1f} s", soft_wrap=True)
    out.print(_line("publish --full", full), soft_wrap=True)
    out.print(f"build of night {newest.stem}: {night:.2f} s", soft_wrap=True)
    out.print(_line("its publish", one) + f": {100 * one.seconds / night:.1f} % of its build", soft_wrap=True)
    kinds = ", ".join(f"{kind} {seconds:.2f} s" for kind, seconds in sorted(one.by_kind.items()))
    out.print(f"its publish by kind of table: {kinds}", soft_wrap=True)
    floor = _read_whole_tables(data_dir)
    slowest = ", ".join(f"{name} {s:.2f} s" for name, s in sorted(floor.items(), key=lambda i: -i[1])[:5])
    out.print(
        f"reading the tables kept whole in DuckDB alone: {sum(floor.values()):.2f} s ({slowest})",
        soft_wrap=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--url", required=True, help="a throwaway PostgreSQL database (libpq URL)")
    args = parser.parse_args(argv)
    return run(args.data_dir, args.url)


if __name__ == "__main__":
    raise SystemExit(main())
