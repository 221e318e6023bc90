"""For tests that damage a journal by hand: write bytes where the next entry would go.

A journal's space is allocated ahead (zeros after its last entry), so "the end of the file" is
not where a process killed mid-append leaves its bytes.
"""
from __future__ import annotations

from tracemem.store.write.journal import entries_end


def write_at_tail(journal: str, data: bytes) -> None:
    """Write `data` right after the last whole entry of the journal file at `journal`."""
    with open(journal, "r+b") as f:
        f.seek(entries_end(journal))
        f.write(data)
