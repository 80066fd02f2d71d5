"""Where a command's logs go: a file per run under ``DATA_DIR/logs/``, never the terminal.

The terminal belongs to the progress bar, the summary and one-line errors. Everything logged
(ours at INFO, Prefect's flow and task run lines, the HTTP stack's warnings) goes to
``DATA_DIR/logs/<stem>-<UTC time>.log`` (owner-only), through the same redacting filter that
guards every other log line, so no credential or secret value reaches the file either.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
from pathlib import Path

from membersync.extract import redact
from membersync.warehouse.landing.paths import FILE_MODE, DataDir
from rich.console import Console

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
NOISY_LOGGERS = ("httpx", "httpcore", "aiohttp.access", "aiosqlite", "alembic")
_handler: logging.Handler | None = None


def start(data_dir: DataDir, stem: str) -> Path:
    """Send every log record (INFO and up) to a new file under ``DATA_DIR/logs``; return its path."""
    global _handler
    data_dir.logs.mkdir(parents=True, exist_ok=True)
    path = data_dir.logs / f"{stem}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.log"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE))
    os.chmod(path, FILE_MODE)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(redact.RedactingFilter())
    _handler = handler
    root = logging.getLogger()
    root.addHandler(handler)
    debugging = root.level and root.level <= logging.DEBUG  # someone asked for DEBUG: keep it
    if not debugging:
        root.setLevel(logging.INFO)
        handler.setLevel(logging.INFO)
        for chatty in NOISY_LOGGERS:  # a line per HTTP request would make a night's log gigabytes
            logging.getLogger(chatty).setLevel(logging.WARNING)
    else:
        handler.setLevel(logging.DEBUG)
    quiet_console()
    return path


def capture_stray_output(path: Path, *consoles: Console) -> None:
    """Point file descriptor 2 at the log file; ``consoles`` keep writing to the terminal.

    Libraries that write to stderr directly (uvicorn, serving the local Prefect server)
    would otherwise print tracebacks between the progress bar and the one-line errors, e.g.
    while the server shuts down after a Ctrl-C. What they write is kept, in the log file.
    """
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    os.dup2(fd, 2)
    os.close(fd)
    for console in consoles:
        console.file = terminal


def quiet_console() -> None:
    """Detach every handler that writes to the terminal; records they carried go to the file.

    Call again after importing Prefect: its logging setup puts a console handler on the root
    logger and on loggers that do not propagate.
    """
    if _handler is None:
        return
    root = logging.getLogger()
    loggers = [
        root,
        *(lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ]
    for logger in loggers:
        for handler in list(logger.handlers):
            if _writes_to_terminal(handler):
                logger.removeHandler(handler)
                if logger is not root and not logger.propagate and _handler not in logger.handlers:
                    logger.addHandler(_handler)
    if _handler not in root.handlers:
        root.addHandler(_handler)


def _writes_to_terminal(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
