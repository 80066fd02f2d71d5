"""The Debian packages the tests drive as real parts, and where their programs are.

A browser, an office suite to open the XLSX as a manager would, poppler to read its PDF, and
PostgreSQL for the work pool's Prefect server. ``tests/checks.py`` (the README's test command)
installs the missing ones when it can (root with apt-get, as on a fresh CI machine); the tests
that need them fail with a clear message when they are absent.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SYSTEM_PACKAGES: dict[str, str] = {  # executable -> Debian package
    # tests/unit/warehouse/test_warehouse_xlsx.py opens the report workbook in LibreOffice Calc
    # and reads the PDF; the -nogui build is the smallest headless soffice with Calc (no X11/GTK).
    "soffice": "libreoffice-calc-nogui",
    "pdftotext": "poppler-utils",
    # tests/unit/flows/test_serve_ui.py opens `membersync serve`'s Prefect UI in headless chromium.
    "chromium": "chromium",
    # tests/scenarios/test_work_pool.py runs its Prefect server on PostgreSQL, as a pool of workers should:
    # on SQLite, 3 workers' writes lock the file and the server drops events ("database is locked").
    "initdb": "postgresql",
}


def system_executable(name: str) -> str | None:
    """The path of a system program: on ``PATH``, or where Debian keeps PostgreSQL's servers
    (``/usr/lib/postgresql/<version>/bin``, not on ``PATH``); ``None`` when absent."""
    found = shutil.which(name)
    if found is not None:
        return found

    def version(bin_dir: Path) -> tuple[int, str]:  # "15" after "9"
        return len(bin_dir.parent.name), bin_dir.parent.name

    newest_first = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    candidates = [bin_dir / name for bin_dir in newest_first]
    return next((str(c) for c in candidates if c.exists()), None)


def missing_packages() -> list[str]:
    return sorted({pkg for exe, pkg in SYSTEM_PACKAGES.items() if system_executable(exe) is None})
