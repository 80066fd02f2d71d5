"""Look for personal values in every byte we wrote: files decoded as a reader would read them.

A canary is a value no other data holds (a made-up name, email, phone, address); a hit anywhere
means it was not forgotten. What is read:

- Parquet: every cell of every column, as text (compressed pages would hide a raw match);
- DuckDB databases: every table's cells and every view's SQL (a copy is opened read-only);
- XLSX: every part of the zip (shared strings, sheets);
- anything else (CSV, HTML, JSON, logs, SQLite of Prefect, dbt's files): its raw bytes.

:func:`scan_bucket` does the same for every version of every object of an S3 bucket (a deleted
object's older versions included), downloaded to a scratch folder.

A client number is a canary too, but digits occur everywhere: it is matched as a whole cell in
structured data and as a whole word (no digit around it) in text.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Canary:
    """What a client is known by: their number and their personal values."""

    number: str
    values: tuple[str, ...]

    def patterns(self) -> list[re.Pattern[str]]:
        out = [re.compile(re.escape(v), re.IGNORECASE) for v in self.values]
        out.append(re.compile(rf"(?<![0-9]){re.escape(self.number)}(?![0-9])"))
        return out


def _cells_of_parquet(path: Path) -> Iterable[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for column in table.columns:
        for value in column.to_pylist():
            if value is not None:
                yield str(value)


def _cells_of_duckdb(path: Path) -> Iterable[str]:
    import duckdb

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        con = duckdb.connect(str(copy), read_only=True)
        try:
            for (sql,) in con.execute("SELECT sql FROM duckdb_views() WHERE NOT internal").fetchall():
                yield str(sql)
            tables = con.execute("SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
            for schema, table in tables:
                for row in con.execute(f'SELECT * FROM "{schema}"."{table}"').fetchall():
                    yield from (str(v) for v in row if v is not None)
        finally:
            con.close()


def texts_of(path: Path) -> list[str]:
    """A file's content as a reader would search it (see the module's docstring)."""
    head = path.read_bytes()[:16]
    if path.suffix == ".parquet" or head.startswith(b"PAR1"):
        return list(_cells_of_parquet(path))
    if path.suffix == ".duckdb" or head[8:12] == b"DUCK":
        return list(_cells_of_duckdb(path))
    if path.suffix == ".xlsx" or head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as book:
                return [book.read(n).decode("utf-8", "replace") for n in book.namelist()]
        except zipfile.BadZipFile:
            pass
    return [path.read_bytes().decode("utf-8", "replace")]


def scan_files(roots: Sequence[Path], canaries: Sequence[Canary]) -> dict[str, list[str]]:
    """canary number -> the files (under ``roots``) that hold one of its values."""
    hits: dict[str, list[str]] = {c.number: [] for c in canaries}
    patterns = [(c, c.patterns()) for c in canaries]
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            try:
                texts = texts_of(path)
            except Exception as exc:  # a file we cannot decode is a failure of the scan itself
                raise AssertionError(f"cannot scan {path}: {exc}") from exc
            for canary, found in patterns:
                if any(p.search(t) for t in texts for p in found):
                    hits[canary.number].append(str(path))
    return hits


def s3_client() -> Any:
    """A plain boto3 client (not the code under test) from the standard AWS variables."""
    import os

    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION"))


def scan_bucket(bucket: str, canaries: Sequence[Canary], prefix: str = "") -> dict[str, list[str]]:
    """canary number -> the object versions of ``bucket`` (under ``prefix``) that hold one of its values."""
    client = s3_client()
    hits: dict[str, list[str]] = {c.number: [] for c in canaries}
    with tempfile.TemporaryDirectory(prefix="bucket-scan-") as tmp:
        for index, (key, version) in enumerate(object_versions(client, bucket, prefix)):
            body = client.get_object(Bucket=bucket, Key=key, VersionId=version)["Body"].read()
            folder = Path(tmp) / str(index)
            folder.mkdir()
            (folder / Path(key).name).write_bytes(body)
            for number, found in scan_files([folder], canaries).items():
                if found:
                    hits[number].append(f"{key}@{version}")
            shutil.rmtree(folder)
    return hits


def object_versions(client: Any, bucket: str, prefix: str = "") -> list[tuple[str, str]]:
    """(key, version id) of every object version of the bucket (delete markers left out)."""
    out: list[tuple[str, str]] = []
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        page = client.list_object_versions(**kwargs)
        out += [(v["Key"], v["VersionId"]) for v in page.get("Versions", [])]
        if not page.get("IsTruncated"):
            return out
        kwargs["KeyMarker"] = page.get("NextKeyMarker")
        kwargs["VersionIdMarker"] = page.get("NextVersionIdMarker")
