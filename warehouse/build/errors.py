"""What a build can fail with (the previous warehouse is untouched by every one of them)::

BuildError
├── BuildInputError    the landing zone cannot be built from
├── BuildStaleError    a newer warehouse was published meanwhile (the newer one is kept)
└── BuildCheckError    a model failed a test or did not build (names the model and check)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence


class BuildError(RuntimeError):
    """The build failed; the previous warehouse is untouched."""


class BuildInputError(BuildError, ValueError):
    """The landing zone cannot be built from (no committed night, a manifest names a missing file)."""


class BuildStaleError(BuildError):
    """A newer warehouse was published while this build ran; the newer one is kept."""


class BuildCheckError(BuildError):
    """A model failed a test (or did not build); the message names the model and the check."""

    def __init__(self, model: str, check: str, detail: str) -> None:
        self.model = model
        self.check = check
        self.detail = detail
        super().__init__(f"build check failed: {model}: {check}: {detail}")


def newer_nights(published: Mapping[dt.date, str], ours: Mapping[dt.date, str]) -> list[dt.date]:
    """Nights the published warehouse holds that this build lacks, or holds in a later commit."""
    return sorted(d for d, at in published.items() if d not in ours or at > ours[d])


def stale(newer: Sequence[dt.date]) -> BuildStaleError:
    return BuildStaleError(
        f"a newer warehouse was published while this build ran (it holds night(s) "
        f"{', '.join(d.isoformat() for d in newer)} newer than this build's); keeping the newer one"
    )
