"""One way to change a committed night (issue 60): besides a night's own commit
(``warehouse/landing/night.py``), only ``warehouse/landing/rewrite.py`` (behind
``LandingZone.rewrite_night`` and ``remove_night``) publishes a landed file or writes or removes
a manifest. A new wing that does it itself (forget, retention and migrate did, each its own way)
fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import FOLDERS, ROOT, module_name

# The store's operations that publish: what a reader of the manifests would see.
PUBLISHING = {"commit_manifest", "remove_manifest", "publish"}
# write_parquet_atomic writes a landed file in place: only the commit paths may.
WRITING = {"write_parquet_atomic"}
ALLOWED = {
    "membersync.warehouse.landing.night",  # a night's own commit
    "membersync.warehouse.landing.rewrite",  # every later change to a committed night
    "membersync.warehouse.landing.storage",  # where the operations are defined
    "membersync.warehouse.landing.atomic",  # where write_parquet_atomic is defined
}


def _calls(path: Path) -> set[str]:
    """Names of the functions and methods called in a file (``x.publish(...)`` -> ``publish``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name:
                found.add(name)
    return found


def publishers() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            hits = _calls(path) & (PUBLISHING | WRITING)
            if hits:
                out[module_name(path)] = hits
    return out


def test_only_the_landing_zone_publishes_files_or_manifests() -> None:
    found = publishers()
    assert {"membersync.warehouse.landing.night", "membersync.warehouse.landing.rewrite"} <= set(
        found
    )  # seen
    assert {name: hits for name, hits in found.items() if name not in ALLOWED} == {}


def test_the_scan_catches_a_module_that_publishes_itself(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f(zone, m):\n    zone.store.commit_manifest(m, None)\n")
    assert _calls(rogue) & PUBLISHING == {"commit_manifest"}
