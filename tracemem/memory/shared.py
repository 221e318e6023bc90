"""One memory written by many processes: keeping the in-process index in step with the others.

On DuckDB one process writes the file, so the index it keeps is the truth. On PostgreSQL any
number of processes remember, flag, forget and purge in the same tables, so before each
search `catch_up` reads the `memory_events` rows after the last one this process has seen (the
store's SQL object guarantees ids become visible in order) and, for every memory they name,
replaces what the index holds with the stored record as it is now, or drops it when it is
forgotten or purged. A memory remembered by another process is therefore found by this one's
very next search.

The last word is the table's: every search reads back the records it is about to return and
checks them against the index (`search.scored_records`), so a record another process flagged,
forgot or purged a moment after the catch-up is never injected from a stale index either.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .index import VectorIndex
from .tables import MEMORY_COLUMNS

__all__ = ["catch_up"]

_DELETED = MEMORY_COLUMNS.index("deleted_at")
_SUBJECT = MEMORY_COLUMNS.index("subject")
_UPDATED = MEMORY_COLUMNS.index("updated_at")


def catch_up(index: VectorIndex, ops: Any, con: Any, seen: int) -> int:
    """Apply every memory change after event `seen` to `index`; returns the newest event id applied."""
    newest, ids = ops.events_after(con, seen)
    if not ids:
        return seen
    current = ops.current(con, ids)
    for memory_id in ids:
        found = current.get(memory_id)
        if found is not None and ops.written.get(memory_id) == found[0][_UPDATED]:
            continue  # this process wrote the record as it stands: the index has it already
        for shard in list(index.shards.values()):
            shard.retire(memory_id)
        if found is None or found[0][_DELETED] is not None:
            continue  # purged, or forgotten
        rec, vec = found
        vecs = None
        if index.dim is not None:  # a record stored without a vector matches literally only
            ok = vec is not None and len(vec) == index.dim
            vecs = np.asarray(vec, dtype=np.float32).reshape(1, -1) if ok else np.zeros((1, index.dim), np.float32)
        index.add_many([rec], vecs)
    return newest
