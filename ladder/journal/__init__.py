"""The sealed journal: an append-only, hash-chained record of one migration (ladder.journal.store)."""

from ladder.journal.store import (
    AUTHORS,
    KINDS,
    Entry,
    Journal,
    VerifyResult,
    entry_sha256,
    verify_journal,
)

__all__ = ["AUTHORS", "KINDS", "Entry", "Journal", "VerifyResult", "entry_sha256", "verify_journal"]
