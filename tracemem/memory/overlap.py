"""A big `remember_many` into DuckDB, with DuckDB's work overlapped with Python's.

Why: at a million records a bulk insert spent about as long in DuckDB (the INSERT
of each batch, its COMMIT) as in Python (embedding, building the Arrow table,
adding to the index), one after the other. DuckDB releases the GIL while it works,
so a second thread can insert one block while this one embeds the next, and commit
while this one updates the index: with a free core, DuckDB's share costs little
wall-clock time. Same transaction, same rows, same vectors (the hashing embedder's
`embed_chunks` gives what one `embed` call gives), same events: only the order of
work changes. The connection is never used by two threads at once: one worker runs
every statement in order, and it has finished before this returns or raises.
"""

from __future__ import annotations

import itertools
import sys
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Sequence

import duckdb
import numpy as np

from . import binding, sql
from .bulk import rows_of
from .cache import IndexCache
from .fingerprint import Fingerprint
from .index import VectorIndex
from .records import MemoryRecord

__all__ = ["BLOCK", "MIN_ROWS", "TAIL", "can_overlap", "remember_overlapped"]

BLOCK = 1_250  # records per INSERT: small enough to overlap, big enough that a statement's fixed cost is noise
MIN_ROWS = 2 * BLOCK
TAIL = BLOCK // 4  # records in the last block, whose insert nothing overlaps


def can_overlap(ops: Any, embedder: Any, n: int) -> bool:
    """A DuckDB store (memory/sql.py), an embedder that embeds in blocks, and enough records to split."""
    return ops is sql and n >= MIN_ROWS and callable(getattr(embedder, "embed_chunks", None))


def remember_overlapped(con: duckdb.DuckDBPyConnection, embedder: Any, recs: Sequence[MemoryRecord],
                        events: Callable[[], list[tuple[Any, ...]]], index: VectorIndex, cache: IndexCache) -> None:
    """Write `recs` and their `events()` in one transaction, and add them to `index`.

    The worker inserts the events while this thread embeds the first block, each block while
    this thread embeds the next, then commits while
    this thread adds the rows to the index. If the commit fails, the index holds rows
    the table does not: it is dropped, and the next use re-opens it from DuckDB.
    """
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracemem-memory-insert")
    try:
        tx = sql.transaction(con)
        tx.__enter__()
        try:
            added, rows, vecs = _write(con, worker, embedder, recs, events)
            binding.bind(con, embedder)
        except BaseException:
            if not tx.__exit__(*sys.exc_info()):  # ROLLBACK
                raise
        committed = worker.submit(tx.__exit__, None, None, None)  # COMMIT (and any checkpoint) in the worker
        try:
            index.add_many(rows, vecs)
        except BaseException:
            cache.invalidate()
            raise
        finally:
            try:
                committed.result()
            except BaseException:
                cache.invalidate()
                raise
    finally:
        worker.shutdown(wait=True)  # nothing runs on the connection after this, whatever happened here
    cache.note(added)


def _write(con: duckdb.DuckDBPyConnection, worker: ThreadPoolExecutor, embedder: Any, recs: Sequence[MemoryRecord],
           events: Callable[[], list[tuple[Any, ...]]]
           ) -> tuple[list[tuple[str, Fingerprint, int]], list[tuple[Any, ...]], np.ndarray]:
    """Insert the `events()` of `recs`, then embed and insert `recs` block by block; returns the fingerprint
    parts, rows, vectors.

    Every write has finished when this returns or raises.
    """
    rows: list[tuple[Any, ...]] = []
    vecs: list[np.ndarray] = []
    writes: list[Future[Any]] = []
    try:
        # the events first: they need no vector, and the worker is idle until the first block is embedded
        writes.append(worker.submit(sql.insert_events, con, events()))
        texts = [r.text for r in recs]
        cut = max(0, len(recs) - TAIL)  # a short last block: this thread waits for its insert alone
        bounds = [*range(0, cut, BLOCK), cut, len(recs)] if cut else [0, len(recs)]
        blocks = itertools.chain(binding.embed_blocks(embedder, texts[:cut], BLOCK),
                                 binding.embed_blocks(embedder, texts[cut:], TAIL))
        for start, end, block in zip(bounds, bounds[1:], blocks):
            part = rows_of(recs[start:end])
            table = sql.records_table(part, block, embedder.dim)
            writes.append(worker.submit(sql.insert_table, con, table))
            rows += part
            vecs.append(block)
            if any(w.done() and w.exception() is not None for w in writes):
                break  # the first error is raised below; the rest would only fail the same way
    finally:
        wait(writes)
    added = [part for write in writes for part in (write.result() or ())]  # the first failure raises
    return added, rows, np.concatenate(vecs)
