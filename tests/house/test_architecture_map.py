"""ARCHITECTURE.md is the map a newcomer reads first (issue 60): every room (a folder of the product)
and every module in it is named there, and every file it names exists. A module added without a
word on the map, or one moved or deleted while the map still names it, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import ROOT

MAP = ROOT / "ARCHITECTURE.md"
PYTHON_ROOMS = ("extract", "models", "flows", "warehouse")
LAB = ROOT / "flows" / "benchmarks"  # a room of its own; its modules are listed in its __init__.py
NAMED = re.compile(r"`([A-Za-z0-9_./-]+\.(?:py|sql|md))`")


def _text() -> str:
    return MAP.read_text()


def _product_modules() -> list[Path]:
    return sorted(
        p
        for room in PYTHON_ROOMS
        for p in (ROOT / room).rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts and LAB not in p.parents
    )


def _rooms() -> list[str]:
    folders = {ROOT / r for r in (*PYTHON_ROOMS, "sql")}
    for room in PYTHON_ROOMS:
        folders |= {p.parent for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(f.relative_to(ROOT).as_posix() for f in folders)


def test_every_module_of_the_product_is_on_the_map() -> None:
    text = _text()
    unnamed = [
        p.relative_to(ROOT).as_posix()
        for p in _product_modules()
        if not re.search(rf"`(?:[A-Za-z0-9_/]+/)?{re.escape(p.name)}`", text)
    ]
    assert unnamed == [], "modules ARCHITECTURE.md does not name"


def test_every_room_is_on_the_map() -> None:
    text = _text()
    unnamed = [room for room in _rooms() if f"`{room.rsplit('/', 1)[-1]}/`" not in text]
    assert unnamed == [], "rooms ARCHITECTURE.md does not name"


def _files() -> set[str]:
    """Every file of the repository a map may name (not the virtualenv, not data dirs)."""
    top = {p.name for p in ROOT.iterdir() if p.is_file()}
    within = {
        p.relative_to(ROOT).as_posix()
        for folder in (*PYTHON_ROOMS, "sql", "tests", "docs", ".ci")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    return top | within


def test_every_file_the_map_names_exists() -> None:
    files = _files()
    missing = [
        named
        for named in sorted(set(NAMED.findall(_text())))
        if named not in files and not any(path.endswith("/" + named) for path in files)
    ]
    assert missing == [], "files ARCHITECTURE.md names that do not exist"
