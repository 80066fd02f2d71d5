"""The one atomic writer: a temporary a killed writer left beside its target goes on the next write."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from membersync.warehouse.landing.atomic import TMP_MARK, alive, write_file_atomic

# A writer that opens its temporary (named as tmp_name names it: its own pid) and hangs there.
_HANGING_WRITER = """
import os, sys, time
from pathlib import Path
target = Path(sys.argv[1])
tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-c8fbb0b0")
tmp.write_bytes(b"half a report")
print(tmp, flush=True)
time.sleep(600)
"""


def _hanging_writer(target: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HANGING_WRITER, str(target)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_case_a_report_rewritten_after_its_writer_was_killed_mid_write_leaves_no_temporary(
    tmp_path: Path,
) -> None:
    target = tmp_path / "reports" / "2026-11-23" / "mrr_by_store_2026-11-23.csv"
    target.parent.mkdir(parents=True)
    killed, killed_tmp = _hanging_writer(target)
    running, running_tmp = _hanging_writer(target)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert TMP_MARK in killed_tmp.name and killed_tmp.exists()

        write_file_atomic(target, b"store,mrr\r\n")

        assert target.read_bytes() == b"store,mrr\r\n"
        assert not killed_tmp.exists()  # its writer is gone: removed
        assert running_tmp.exists()  # a writer still running keeps its temporary
    finally:
        running.kill()
        running.wait()


def test_case_a_killed_child_not_yet_reaped_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    assert alive(child.pid)
    child.send_signal(signal.SIGKILL)
    try:
        deadline = time.monotonic() + 10
        while alive(child.pid) and time.monotonic() < deadline:  # a zombie until wait()
            time.sleep(0.01)
        assert not alive(child.pid)
    finally:
        child.wait()
