"""What a night did: :class:`RunSummary`, counts only (never data, never a secret), shown on the
terminal, recorded in the manifest (:meth:`RunSummary.stats`) and as the Prefect artifact."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunSummary:
    """What a night did. Holds counts only (never data, never a secret)."""

    night: dt.date
    run_id: str = ""
    mode: str = "full"
    status: str = "running"  # running | committed | failed
    resumed: bool = False
    clients: int = 0
    batches: int = 0
    batches_skipped: int = 0  # written by an interrupted run of the same night
    rows: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0
    requests: int = 0
    retries: int = 0
    status_429: int = 0
    errors: int = 0
    by_status: dict[str, int] = field(default_factory=dict)  # HTTP answers by status
    bytes_received: int = 0  # bodies of the HTTP answers
    duration_s: float = 0.0
    cpu_s: float = 0.0
    watermark: str | None = None
    window: str = ""
    build: str = "not run"
    retention: str = "keep everything"
    reports: list[str] = field(default_factory=list)
    error: str | None = None
    # The self-audit: counts (sampled, differed, tables, keys, healed), and the keys that differed
    # (client key -> table -> row keys; ids only, never a value), shown in the Prefect artifact only.
    audit: str = "not run"
    audit_counts: dict[str, int] = field(default_factory=dict)
    audit_differed: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    def shortfall(self) -> str | None:
        """Why a night that ended without an error still needs a look (not committed, or its
        warehouse build failed), as one line; None when it is all done."""
        if self.status == "committed" and self.build.startswith(("ok", "skipped")):
            return None
        return f"night {self.night} {self.status}; warehouse build: {self.build}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["night"] = self.night.isoformat()
        out["requests_per_s"] = round(self.requests_per_s, 1)
        out["duration_s"] = round(self.duration_s, 3)
        out["cpu_s"] = round(self.cpu_s, 3)
        return out

    def stats(self) -> dict[str, Any]:
        """The part recorded in the night's manifest."""
        return {
            "requests": self.requests,
            "retries": self.retries,
            "status_429": self.status_429,
            "errors": self.errors,
            "bytes_received": self.bytes_received,
            "duration_s": round(self.duration_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "batches": self.batches,
            "batches_skipped": self.batches_skipped,
            "resumed": self.resumed,
            "window": self.window,
            "audit": {"status": self.audit, **self.audit_counts},
        }

    def table_rows(self, keys: bool = False) -> list[dict[str, str]]:
        """The summary as rows of (item, value): the terminal table and the Prefect artifact.

        With ``keys`` (the artifact), one more row per client the self-audit found different,
        naming its tables and keys; the terminal and the manifest show counts only."""
        rows = [
            ("night", self.night.isoformat()),
            ("status", self.status),
            ("mode", self.mode + (" (resumed)" if self.resumed else "")),
            ("clients synced", f"{self.clients:,}"),
            ("batches", f"{self.batches} ({self.batches_skipped} reused from the interrupted run)"),
            ("history window", self.window),
            ("requests", f"{self.requests:,}"),
            ("requests/s (night average)", f"{self.requests_per_s:,.0f}"),
            ("retries", f"{self.retries:,}"),
            ("429 answers", f"{self.status_429:,}"),
            ("night duration (from opening the night)", f"{self.duration_s:,.1f} s"),
            ("watermark", self.watermark or "-"),
            ("warehouse build", self.build),
            ("retention", self.retention),
        ]
        rows += [(f"rows: {name}", f"{count:,}") for name, count in sorted(self.rows.items())]
        rows.append(("rows: quarantined", f"{self.quarantined:,}"))
        rows += self._audit_rows(keys)
        if self.error:
            rows.append(("error", self.error))
        return [{"item": k, "value": v} for k, v in rows]

    def _audit_rows(self, keys: bool) -> list[tuple[str, str]]:
        rows = [("self-audit", self.audit)]
        counts = self.audit_counts
        if counts:
            rows += [
                ("self-audit: clients sampled", f"{counts.get('sampled', 0):,}"),
                ("self-audit: clients differed", f"{counts.get('differed', 0):,}"),
                ("self-audit: tables differed", f"{counts.get('tables', 0):,}"),
                ("self-audit: keys differed", f"{counts.get('keys', 0):,}"),
                ("self-audit: clients re-synced tonight", f"{counts.get('healed', 0):,}"),
            ]
        if keys:
            for client_key, by_table in sorted(self.audit_differed.items()):
                what = "; ".join(f"{table}: {', '.join(ks)}" for table, ks in sorted(by_table.items()))
                rows.append((f"self-audit differed: client {client_key}", what))
        return rows
