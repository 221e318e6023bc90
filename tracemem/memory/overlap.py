"""The write of a big `remember_many` into DuckDB, overlapped with the embedding of its next block.

Why: at a million records a bulk insert spent about as long in DuckDB (the INSERT
of each batch) as in Python (embedding, building the Arrow table), one after the
other. DuckDB releases the GIL while it inserts, so a second thread can write one
block while this one embeds and builds the next: on two cores the INSERT costs
little wall-clock time. Same transaction, same rows, same vectors (the hashing
embedder's `embed_chunks` gives what one `embed` call gives), same events: only
the order of work changes. The connection is never used by two threads at once:
one worker runs every statement in order, and it has finished before this returns
or raises.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

import duckdb
import numpy as np

from . import binding, sql
from .bulk import rows_of
from .fingerprint import Fingerprint
from .records import MemoryRecord

__all__ = ["BLOCK", "MIN_ROWS", "can_overlap", "write_overlapped"]

BLOCK = 1_250  # records per INSERT: small enough to overlap, big enough that a statement's fixed cost is noise
MIN_ROWS = 2 * BLOCK


def can_overlap(ops: Any, embedder: Any, n: int) -> bool:
    """A DuckDB store (memory/sql.py), an embedder that embeds in blocks, and enough records to split."""
    return ops is sql and n >= MIN_ROWS and callable(getattr(embedder, "embed_chunks", None))


def write_overlapped(con: duckdb.DuckDBPyConnection, embedder: Any, recs: Sequence[MemoryRecord],
                     events: Callable[[], list[tuple[Any, ...]]]
                     ) -> tuple[list[tuple[str, Fingerprint, int]], list[tuple[Any, ...]], np.ndarray]:
    """Embed and insert `recs` block by block, then their `events()`, inside the caller's transaction.

    Returns what the rows add to the fingerprint, the rows and their vectors (for the index).
    """
    rows: list[tuple[Any, ...]] = []
    vecs: list[np.ndarray] = []
    writes: list[Future[Any]] = []
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracemem-memory-insert")
    try:
        blocks = binding.embed_blocks(embedder, [r.text for r in recs], BLOCK)
        for start, block in zip(range(0, len(recs), BLOCK), blocks):
            part = rows_of(recs[start : start + BLOCK])
            table = sql.records_table(part, block, embedder.dim)
            writes.append(worker.submit(sql.insert_table, con, table))
            rows += part
            vecs.append(block)
            if any(w.done() and w.exception() is not None for w in writes):
                break  # the first error is raised below; the rest would only fail the same way
        else:
            writes.append(worker.submit(sql.insert_events, con, events()))
    finally:
        worker.shutdown(wait=True)  # nothing runs on the connection after this, whatever happened here
    added = [part for write in writes for part in (write.result() or ())]  # the first failure raises
    return added, rows, np.concatenate(vecs)
