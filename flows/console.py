"""The CLI's one place to write: ``out`` (what a command answers, on stdout), ``err`` (progress,
notes and errors, on stderr), and :func:`error`, the one error printer.

Nothing printed is read as rich markup (both consoles have it off): a client number, a path or a
SQL error holding ``[`` ... ``]`` is shown as it is (as markup it was mangled, or raised rich's
MarkupError instead of the one line). Styles are given as ``style=`` or :class:`~rich.text.Text`.
An error is one line, ``error: <message>``.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

out = Console(highlight=False, markup=False)
err = Console(stderr=True, highlight=False, markup=False)


def error(message: str, console: Any = None) -> None:
    """Print ``error: <message>`` (bold red label) on ``console`` (default: :data:`err`)."""
    (console or err).print(Text.assemble(("error:", "bold red"), " ", str(message)), soft_wrap=True)
