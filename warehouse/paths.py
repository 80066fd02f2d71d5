"""Where membersync writes: everything lives under one data dir.

``MEMBERSYNC_DATA_DIR`` (default: ``warehouse/data`` inside the repository, git-ignored)::

    DATA_DIR/
      landing/<table>/snapshot_date=YYYY-MM-DD/part-*.parquet   published Parquet
      landing/_manifests/YYYY-MM-DD.json                         a night's commit
      landing/_staging/YYYY-MM-DD/...                            a night being written
      state/state.json                                           watermark, committed nights
      warehouse.duckdb                                           the warehouse (swapped whole)
      reports/YYYY-MM-DD/<report>_YYYY-MM-DD.csv                 the morning's CSVs
      logs/                                                      run logs
      .lock                                                      one sync at a time

Everything written there is readable by its owner only (files 0600, folders 0700).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "data"
FILE_MODE = 0o600
DIR_MODE = 0o700


@dataclass(frozen=True)
class DataDir:
    root: Path

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> DataDir:
        env = dict(os.environ) if env is None else env
        raw = env.get("MEMBERSYNC_DATA_DIR")
        return cls(Path(raw).expanduser().resolve() if raw else DEFAULT_DATA_DIR)

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def manifests(self) -> Path:
        return self.landing / "_manifests"

    @property
    def staging(self) -> Path:
        return self.landing / "_staging"

    @property
    def rate_file(self) -> Path:
        """The server's rate the last night found (where the next night's client starts)."""
        return self.state_file.parent / "rate.json"

    @property
    def state_file(self) -> Path:
        return self.root / "state" / "state.json"

    @property
    def warehouse_db(self) -> Path:
        return self.root / "warehouse.duckdb"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    def ensure(self) -> None:
        """Create the data dir (owner-only) or raise OSError naming it."""
        for path in (
            self.root,
            self.landing,
            self.manifests,
            self.staging,
            self.state_file.parent,
            self.reports,
            self.logs,
        ):
            path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        os.chmod(self.root, DIR_MODE)
