"""The CLI's one place to write: ``out`` (what a command answers, on stdout), ``err`` (progress,
notes and errors, on stderr), and :func:`error`, the one error printer.

Nothing printed is read as rich markup (both consoles have it off): a client number, a path or a
SQL error holding ``[`` ... ``]`` is shown as it is (as markup it was mangled, or raised rich's
MarkupError instead of the one line). Styles are given as ``style=`` or :class:`~rich.text.Text`.
An error is one line, ``error: <message>``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

out = Console(highlight=False, markup=False)
err = Console(stderr=True, highlight=False, markup=False)


def error(message: str, console: Any = None) -> None:
    """Print ``error: <message>`` (bold red label) on ``console`` (default: :data:`err`)."""
    (console or err).print(Text.assemble(("error:", "bold red"), " ", str(message)), soft_wrap=True)


@contextlib.contextmanager
def nights_progress(what: str) -> Iterator[Callable[[int, int], None]]:
    """A callback ``(done, total)`` drawing nights done of nights and the time left on :data:`err`.
    Nothing is drawn until a call leaves nights to do: a build of one batch stays quiet."""
    bar = Progress(
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("nights"),
        TimeRemainingColumn(),
        console=err,
    )
    task: list[Any] = []

    def told(done: int, total: int) -> None:
        if not task:
            if done >= total:
                return
            bar.start()
            task.append(bar.add_task(what, total=total))
        bar.update(task[0], completed=done)

    try:
        yield told
    finally:
        if task:
            bar.stop()
