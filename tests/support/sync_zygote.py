"""A pre-imported parent that forks ``membersync`` commands, so a reliability run costs no start-up.

Importing membersync's sync path (Prefect, DuckDB, pyarrow, aiohttp) costs ~3 s of CPU per
process; the crash scenarios start dozens of syncs. This process imports everything once (it
starts no thread, so forking is safe), then for each request forks a child that becomes a new
session (its own process group, so a test can SIGKILL "the whole sync process group"), sets the
request's environment, and runs the real CLI entry point (``membersync.flows.cli.commands.app``) exactly
as the console script would. The child is a real process doing real file I/O; only the Python
start-up is shared.

Protocol: one JSON object per line on stdin, one answer per line on stdout.

- ``{"op": "spawn", "argv": [...], "env": {...}, "cwd": "...", "stdout": path, "stderr": path,
  "log_file": path | null, "log_level": "DEBUG" | null, "rlimit_fsize": bytes | null}``
  -> ``{"pid": n}``
- ``{"op": "wait", "pid": n, "timeout": s}`` -> ``{"status": exit code | -signal | null}``
  (null: still running after ``timeout``)
- ``{"op": "exit"}``
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from typing import Any


def _preload() -> None:
    import duckdb  # noqa: F401
    import membersync.extract.client
    import membersync.flows.cli.commands
    import membersync.flows.cli.reports_cli
    import membersync.flows.cli.sync_cli
    import membersync.flows.night.nightly
    import membersync.warehouse.build.builder
    import membersync.warehouse.exports.export
    import membersync.warehouse.landing.zone  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    _import_report_stack()
    _warm_dbt()


def _import_report_stack() -> None:
    """The morning report's charts and the workbooks (~0.65 s of CPU). Importing them starts no
    thread: V8 starts at the first chart, in the child."""
    import altair  # noqa: F401
    import vl_convert  # noqa: F401
    import xlsxwriter  # noqa: F401


def _warm_dbt() -> None:
    """Parse the dbt project (both kinds of build) once here: every forked sync then builds
    without dbt's parse (the product's per-process cache, ``dbt_run._PARSED``)."""
    import tempfile
    import threading
    from pathlib import Path

    from membersync.warehouse.build import builder as build
    from membersync.warehouse.build import dbt_run

    with tempfile.TemporaryDirectory(prefix="zygote-dbt-") as tmp:
        for incremental in (False, True):
            dbt_run.warm(build.SQL_DIR.resolve(), Path(tmp), {"incremental": incremental})
    if threading.active_count() != 1:  # forking a process with threads is unsafe
        raise RuntimeError(f"dbt left {threading.active_count() - 1} thread(s) running in the zygote")


def _child(req: dict[str, Any]) -> None:
    """In the forked child: become a session leader, redirect, run the CLI, never return."""
    code = 70
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req.get("cwd") or os.getcwd())
        if req.get("rlimit_fsize") is not None:
            limit = int(req["rlimit_fsize"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        if req.get("log_file"):
            handler = logging.FileHandler(req["log_file"])
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            root = logging.getLogger()
            root.addHandler(handler)
            root.setLevel(req.get("log_level") or "DEBUG")
        from membersync.flows.cli.commands import app

        sys.argv = ["membersync", *req["argv"]]
        try:
            app(prog_name="membersync")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def main() -> None:
    _preload()
    sys.stdout.write(json.dumps({"ready": os.getpid()}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "exit":
            break
        if req["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(req)
            answer: dict[str, Any] = {"pid": pid}
        elif req["op"] == "wait":
            answer = {"status": _wait(int(req["pid"]), float(req.get("timeout", 600)))}
        else:
            answer = {"error": f"unknown op {req['op']!r}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
