"""Render the measured results of the reliability scenarios as the README's "Reliability" table.

    MEMBERSYNC_RELIABILITY_RESULTS=/tmp/results.jsonl \
        .venv/bin/python -m pytest tests/scenarios/test_reliability*.py
    .venv/bin/python tests/support/reliability_table.py /tmp/results.jsonl  # the table

Each line of the results file is one ``reliability.record(...)`` call; the newest result of a
scenario wins. Nothing here is typed by hand: the table is what the last run measured.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _order(name: str) -> tuple[int, str]:
    match = re.match(r"(\d+)", name)
    return (int(match.group(1)) if match else 99, name)


_TMP = re.compile(r"/tmp/[A-Za-z0-9_.-]+")


def render(results: Path, header: str = "") -> str:
    rows: dict[str, str] = {}
    for line in results.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            figures = item.get("figures") or {}
            seconds = f" ({figures['seconds']} s)" if "seconds" in figures else ""
            rows[item["scenario"]] = item["result"] + seconds
    out = [header] if header else []
    out += ["| # | Scenario | Prefect | Measured result |", "|---|---|---|---|"]
    for name in sorted(rows, key=_order):
        number, _, title = name.partition(" ")
        cell = _TMP.sub("<tmp>", rows[name]).replace("|", "\\|")
        prefect = "on" if "Prefect on" in name else "off"  # the scenarios say so in their name
        title = title.replace(" (Prefect on)", "").replace(" with Prefect on", "")
        out.append(f"| {number} | {title} | {prefect} | {cell} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""))
