"""What one ingest did (`IngestReport`), shared by the ingest of result files (`ingest`) and of
Nsight Compute profiles (`profiles`); a module of its own so that both import it downward."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class IngestReport:
    """What an ingest did, counted in measurements: those already stored are unchanged, and each
    file that could not be stored is one line in `errors` (file: what is wrong)."""

    added: int = 0
    unchanged: int = 0
    added_by_status: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # files with nothing to store, and why (a skipped profile)

    def merge(self, other: IngestReport) -> None:
        self.added += other.added
        self.unchanged += other.unchanged
        self.added_by_status.update(other.added_by_status)
        self.errors.extend(other.errors)
        self.skipped.extend(other.skipped)
