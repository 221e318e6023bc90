"""The memory's SQL on PostgreSQL: what memory/sql.py does with Arrow on DuckDB, done with COPY,
plus what many processes sharing one memory need.

`Memory` takes this object as its `sql` (the store passes it), so memory/api.py runs unchanged
on either database. Two things are new here because other processes write the same tables:

- every change runs in a transaction that first takes one advisory lock per store, so
  `memory_events.event_id` values become visible in the order they were drawn: a process that
  has read every event up to id N will never later see a new event below N, and so "read the
  events after the last one seen" (`events_after`) misses nothing;
- `events_after` and `current` read what changed and the records as they are now, for the
  index to catch up before each search (memory/shared.py); every search then reads back the
  records it returns and checks them against the index, so no record another process flagged,
  forgot or purged a moment ago is injected (memory/search.py).
"""
from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from ...memory import fingerprint
from ...memory.fingerprint import Fingerprint
from ...memory.sql import event_text, update_statement
from ...memory.tables import MEMORY_COLUMNS
from .connection import PgConnection
from .copy import copy_table
from .embeddings import EmbeddingColumn

__all__ = ["PgMemorySQL", "MEMORY_LOCK"]

MEMORY_LOCK = 0x7474  # advisory-lock class: memory changes, one at a time per store
_COLS = ", ".join(MEMORY_COLUMNS)
_UPDATED = MEMORY_COLUMNS.index("updated_at")
_TS = pa.timestamp("us")
_KINDS = {"tags": pa.list_(pa.string()), "confidence": pa.float64(), "source_step": pa.int32(),
          "valid_from": _TS, "valid_until": _TS, "created_at": _TS, "updated_at": _TS, "deleted_at": _TS}
_EVENT_COLS = ["memory_id", "event", "old", "new", "run_id", "at", "reason"]
_EVENT_KINDS = [pa.string()] * 5 + [_TS, pa.string()]


class PgMemorySQL:
    """memory/sql.py's functions for a PostgreSQL store whose embeddings are `kind` ('vector' or 'array',
    see embeddings.py)."""

    SHARED = True  # other processes write these tables too: follow memory_events, recheck before injecting

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.embedding = EmbeddingColumn(kind)
        self.written: dict[str, datetime] = {}  # updated_at of each record this process last wrote

    # -- what memory/sql.py offers -------------------------------------------------------------
    def ensure_tables(self, con: PgConnection) -> None:
        """Nothing to do: pg/schema.py creates the memory tables with the store."""

    @contextmanager
    def transaction(self, con: PgConnection) -> Iterator[None]:
        """A change and its events in one transaction, ordered after every other process's changes."""
        if con.owns_transaction():
            yield
            return
        with con.transaction():
            con.execute("SELECT pg_advisory_xact_lock(?, hashtext(current_schema()))", [MEMORY_LOCK])
            yield

    def insert_records(self, con: PgConnection, recs: Sequence[tuple[Any, ...]], vecs: Optional[np.ndarray],
                       dim: Optional[int]) -> list[tuple[str, Fingerprint, int]]:
        """COPY full records and their vectors; returns what they add to the fingerprints (fingerprint.py)."""
        if not recs:
            return []
        columns: list[Sequence[Any]] = [list(c) for c in zip(*recs)]
        columns[MEMORY_COLUMNS.index("tags")] = [list(t) for t in columns[MEMORY_COLUMNS.index("tags")]]
        kinds = [_KINDS.get(c, pa.string()) for c in MEMORY_COLUMNS]
        embeddings: list[Any] = [None] * len(recs) if vecs is None or dim is None else \
            list(np.asarray(vecs, dtype=np.float32).reshape(len(recs), -1))
        copy_table(con, "memories", [*MEMORY_COLUMNS, "embedding"], kinds + [pa.list_(pa.float32())],  # (a NUL
                   columns + [embeddings], vectors=("embedding",) if self.kind == "vector" else (),  # as \u0000)
                   escape_nul=True)
        self.written.update((r[0], r[_UPDATED]) for r in recs)
        return [(s, fp, +1) for s, fp in fingerprint.of_ids(con, [r[0] for r in recs]).items()]

    def insert_events(self, con: PgConnection, events: Sequence[tuple[Any, ...]]) -> None:
        if not events:
            return
        rows = [(mid, ev, event_text(old), event_text(new), run_id, at, reason) for mid, ev, old, new, run_id, at, reason in events]
        copy_table(con, "memory_events", _EVENT_COLS, _EVENT_KINDS, [list(c) for c in zip(*rows)], escape_nul=True)

    def fetch_records(self, con: PgConnection, where: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in con.execute(f"SELECT {_COLS} FROM memories WHERE {where}", list(params)).fetchall()]

    def update_record(self, con: PgConnection, memory_id: str, fields: dict[str, Any]) -> None:
        con.execute(*update_statement(memory_id, fields, f"?::real[]{self.embedding.cast}"))
        if "updated_at" in fields:
            self.written[memory_id] = fields["updated_at"]

    def load_live(self, con: PgConnection, subjects: Optional[Sequence[str]] = None
                  ) -> tuple[list[tuple[Any, ...]], list[Optional[np.ndarray]]]:
        """Records not forgotten (of the given subjects, or all), with their embeddings (sent as bytes and
        read with numpy)."""
        where, params = "deleted_at IS NULL", []
        if subjects is not None:
            where, params = where + " AND subject = ANY(?::text[])", [list(subjects)]
        rows = con.execute(f"SELECT {_COLS}, {self.embedding.send}(embedding) FROM memories WHERE {where} "
                           f"ORDER BY created_at, memory_id", params, binary=True).fetchall()
        return [tuple(r[:-1]) for r in rows], [self.embedding.decode(r[-1]) for r in rows]

    def write_embeddings(self, con: PgConnection, ids: Sequence[str], vecs: np.ndarray, embedder_id: str) -> None:
        con.executemany(f"UPDATE memories SET embedding = ?::real[]{self.embedding.cast}, embedder_id = ? "
                        f"WHERE memory_id = ?",
                        [(np.asarray(v, dtype=np.float32).tolist(), embedder_id, mid) for mid, v in zip(ids, vecs)])

    def get_meta(self, con: PgConnection, key: str) -> Optional[str]:
        row = con.execute("SELECT value FROM tracemem_meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else None

    def set_meta(self, con: PgConnection, key: str, value: str) -> None:
        con.execute("INSERT INTO tracemem_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                    "SET value = excluded.value", [key, value])

    # -- following other processes -----------------------------------------------------------
    def last_event(self, con: PgConnection) -> int:
        return int(con.execute("SELECT coalesce(max(event_id), 0) FROM memory_events").fetchone()[0])

    def events_after(self, con: PgConnection, seen: int) -> tuple[int, list[str]]:
        """(the newest event id, the memories changed after event `seen`)."""
        rows = con.execute("SELECT event_id, memory_id FROM memory_events WHERE event_id > ? ORDER BY event_id",
                           [seen]).fetchall()
        if not rows:
            return seen, []
        return int(rows[-1][0]), list(dict.fromkeys(r[1] for r in rows))

    def current(self, con: PgConnection, ids: Sequence[str]) -> dict[str, tuple[tuple[Any, ...], Optional[np.ndarray]]]:
        """The stored record (and vector) of each of `ids` that still exists."""
        rows = con.execute(f"SELECT {_COLS}, {self.embedding.send}(embedding) FROM memories "
                           f"WHERE memory_id = ANY(?::text[])", [list(ids)], binary=True).fetchall()
        return {r[0]: (tuple(r[:-1]), self.embedding.decode(r[-1])) for r in rows}
