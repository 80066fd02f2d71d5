"""Every mutation of ``tests/mutations.py`` still applies (its text is in its file exactly once).

The mutation check is slow and not part of CI; without this test a mutation whose code moved
(a module split, a line rewritten) is only found the next time someone runs it."""

from __future__ import annotations

import importlib.util
import sys

from repo_root import REPO


def test_every_mutation_finds_its_text_exactly_once() -> None:
    spec = importlib.util.spec_from_file_location("mutations", REPO / "tests" / "mutations.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutations"] = module  # (its dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["mutations"]
    counts = {m.name: (REPO / m.path).read_text().count(m.old) for m in module.MUTATIONS}
    assert len(counts) > 40
    assert {name: n for name, n in counts.items() if n != 1} == {}
