"""The one way membersync publishes a file: whole or not at all, owner-only, durable.

Every writer of the data dir goes through here (the landing zone's markers, discovery and
manifests, the state files, the report CSVs and workbooks, the audit's queue):

1. write to a temporary name beside the target (it carries :data:`TMP_MARK`, so the landing
   zone's recovery removes one left by a crash), created 0600 whatever the umask;
2. ``fsync`` the file, ``rename`` it over the target (atomic on one file system: a reader sees
   the old file or the new one, never half of one), ``fsync`` the folder (the rename survives a
   power loss);
3. on any error, remove the temporary file and raise: nothing half-written is left.

Folders are created 0700 (:func:`make_dirs`). The warehouse's DuckDB file is published by a
rename of the same kind in :mod:`membersync.warehouse.build.builder`, since DuckDB writes it itself.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE

TMP_MARK = ".tmp-"  # every temporary name carries it; the landing zone's recover() deletes them


def tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path, root: Path | None = None) -> None:
    """Create ``path`` and its missing parents (below ``root``, when given) owner-only (0700)."""
    missing = []
    probe = path
    while not probe.exists() and probe != root and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, DIR_MODE)
        os.chmod(folder, DIR_MODE)
        fsync_dir(folder.parent)


def open_new(path: Path) -> int:
    """A new file opened for writing, 0600 whatever the umask; fails if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def remove_dead_temporaries(path: Path) -> None:
    """Remove the temporaries of ``path`` left by writers that are gone (killed mid-write).

    A temporary's name carries its writer's pid (:func:`tmp_name`); one whose process still runs
    is left alone (a concurrent writer, or a reused pid: it goes on a later write)."""
    prefix = f".{path.name}{TMP_MARK}"
    for entry in path.parent.glob(f"{glob.escape(prefix)}*"):
        pid = entry.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    with contextlib.suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Publish ``data`` at ``path`` (see the module's three steps); the folder must exist.
    A temporary of ``path`` that a killed writer left is removed first."""
    write_chunks_atomic(path, (data,))


@contextlib.contextmanager
def _published(path: Path) -> Iterator[BinaryIO]:
    """A new temporary of ``path`` to write; on leaving, fsynced and renamed over ``path`` and
    the folder fsynced. An error while writing leaves nothing behind."""
    remove_dead_temporaries(path)
    tmp = tmp_name(path)
    try:
        fd = open_new(tmp)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def write_chunks_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """:func:`write_bytes_atomic` of the concatenated ``chunks``, never all held at once (an
    error raised while producing them leaves nothing behind, like one while writing)."""
    with _published(path) as handle:
        for chunk in chunks:
            handle.write(chunk)


def write_file_atomic(path: Path, data: bytes) -> None:
    """:func:`write_bytes_atomic`, creating the folder (0700) first when it is missing."""
    make_dirs(path.parent)
    write_bytes_atomic(path, data)


def write_parquet_atomic(path: Path, table: Any) -> None:
    """An Arrow table as a zstd Parquet file, published like any file (a new landed file of an
    erasure, a migration or a retention run; its folder is created 0700 when missing)."""
    import pyarrow.parquet as pq

    make_dirs(path.parent)
    with _published(path) as handle:
        pq.write_table(table, handle, compression="zstd")


def write_json_atomic(path: Path, body: Any) -> None:
    """``body`` as JSON text (UTF-8), published with :func:`write_file_atomic`."""
    write_file_atomic(path, json.dumps(body, indent=1, ensure_ascii=False).encode())
