"""Python's garbage collector tuned for the duration of a night.

A night allocates a few Python objects per request and per row (aiohttp's request and response
objects, futures, timer handles, the JSON items) and frees nearly all of them at once. With
CPython's default thresholds (a young collection every 700 net allocations) a 36,000-request
night ran ~2,900 collections costing ~2.5-3 s of its ~10-11 s of CPU (measured with
``gc.callbacks``); with a young collection every 10,000 allocations it runs ~100, costing
~0.5 s, with the same peak RSS (179-181 MB). Reference counting still frees everything that is
not a cycle at once; only cyclic garbage waits a little longer.

Importing and setting up Prefect (our process: the client and the flow engine; the local server:
FastAPI's routes, pydantic schemas, the ORM) creates a few hundred thousand objects that all live
on, and the collector's passes over them during the import find nothing to free: with it off
for that time, the local server imports in ~2.8 s of CPU instead of ~3.4 s (5 runs each, least).
:func:`quiet_while_loading` does that, then freezes what was loaded (``gc.freeze``) so that the
night's collections do not walk it again either.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

NIGHT_THRESHOLDS = (10_000, 20, 50)


def tune() -> tuple[int, int, int]:
    """Raise the collector's thresholds (never lower them); returns the previous ones."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(b, n) for b, n in zip(before, NIGHT_THRESHOLDS, strict=True)))
    return before


def restore(before: tuple[int, int, int]) -> None:
    gc.set_threshold(*before)


@contextlib.contextmanager
def quiet_while_loading() -> Iterator[None]:
    """No collection while a large library is imported and set up; then what it loaded moves to
    the permanent generation (never collected: modules, classes, schemas), and the collector is
    on again as before. (A cycle that became garbage during the load stays: a few kB.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
