"""Every check, as the README's test command and ``.ci/run`` run it: the Debian packages the
tests drive (installed when missing, as root), ruff, then mypy beside the whole test suite.

    .venv/bin/python tests/checks.py                  # everything
    .venv/bin/python tests/checks.py -x -k sandbox    # extra arguments go to pytest

Lab code, not the product's: it lives beside the tests and is not installed with membersync.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from system import missing_packages  # tests/support, as for the tests

REPO_ROOT = Path(__file__).resolve().parent.parent

# One pytest worker more than this machine's cores (3 on the 2-core build machine): many tests
# spend their time waiting (rate-limited sandboxes, servers starting, a night's schedule); with
# one worker per core, the cores were busy 1.6 of 2 on average over a run.
CHECK_WORKERS = min(3, (os.cpu_count() or 1) + 1)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ensure_system_packages() -> None:
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        say(f"note: not installing {', '.join(missing)} (needs root and apt-get)")
        return
    say(f"== apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, stdout=subprocess.DEVNULL, env=env)
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    subprocess.run(install, check=False, stdout=subprocess.DEVNULL, env=env)


def run_checks(pytest_args: list[str]) -> int:
    """ruff, then mypy beside pytest: mypy is ~50 s of one core, and the suite leaves a core idle
    for much longer than that (tests waiting on rate limits and servers). A failed mypy stops
    the tests at once, so a type error still fails fast."""
    python = sys.executable
    ensure_system_packages()
    for label, cmd in (
        ("ruff", [python, "-m", "ruff", "check", "."]),
        ("ruff format", [python, "-m", "ruff", "format", "--check", "."]),
    ):
        say(f"== {label}")
        if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
            say(f"{label} failed")
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        mypy = subprocess.Popen(
            _mypy_command(python),
            cwd=REPO_ROOT,
            env={**os.environ, "MYPYPATH": _package_view(Path(tmp))},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        say("== mypy and pytest (mypy's verdict follows when it is done)")
        tests = subprocess.Popen([python, "-m", "pytest", *_pytest_workers(), *pytest_args], cwd=REPO_ROOT)
        typing_report, _ = mypy.communicate()
        say("== mypy")
        say(typing_report.strip())
        if mypy.returncode != 0:
            say("mypy failed: stopping pytest")
            stop_tests(tests)
            return 1
        return tests.wait()


def _package_view(tmp: Path) -> str:
    """mypy sees the repository's fixed layout as the package membersync (as installed)."""
    pkg = tmp / "membersync"
    pkg.mkdir()
    for name in ("extract", "models", "flows", "warehouse"):
        os.symlink(REPO_ROOT / name, pkg / name)
    return str(tmp)


def _mypy_command(python: str) -> list[str]:
    return [
        python,
        "-m",
        "mypy",
        "--cache-dir",
        str(REPO_ROOT / ".mypy_cache"),
        "--namespace-packages",
        "--explicit-package-bases",
        "-p",
        "membersync",
    ]


def _pytest_workers() -> list[str]:
    # A test file at a time per worker: module fixtures (a Prefect harness, a scenario's nights)
    # are made once, and files that share a resource stay apart.
    # --no-loadscope-reorder keeps tests/conftest.py's LONGEST_FIRST order (xdist would otherwise
    # hand out the files with the most tests first, whatever their length).
    if CHECK_WORKERS < 2:
        return []
    return ["-n", str(CHECK_WORKERS), "--dist", "loadfile", "--no-loadscope-reorder"]


def stop_tests(tests: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for pytest (its workers and fixtures clean up), then a kill if it does not stop."""
    tests.send_signal(signal.SIGINT)
    try:
        tests.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tests.kill()
        tests.wait()


if __name__ == "__main__":
    sys.exit(run_checks(sys.argv[1:]))
