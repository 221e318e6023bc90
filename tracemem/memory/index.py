"""The in-process index: per-subject shards holding vectors, lexical postings and filter columns.

Why in-process numpy: an exact top-k over 100k x 384 float32 is one matrix-vector
product (~4 ms on two cores), about ten times faster than a scan in DuckDB.
Why per subject: every search is scoped to one subject, so a shard is the
natural unit — a search touches only its subject's rows (no other subject's
record can ever be scored, let alone returned), and the filters (forgotten,
flagged, confidence, validity window) are numpy columns applied before any
top-k cut.

The index is a cache of the `memories` table: it is loaded from DuckDB through
Arrow, updated by the Memory class on every change, and can be rebuilt at any
time. Rows are append-only; a changed text appends a new row and retires the
old one; shards compact themselves when half their rows are retired.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

import numpy as np

from .lexical import LexicalIndex
from .records import FLAGGED_STATES
from .tables import MEMORY_COLUMNS

__all__ = ["Shard", "VectorIndex", "to_micros"]

_EPOCH = datetime(1970, 1, 1)
_MIN = np.iinfo(np.int64).min
_MAX = np.iinfo(np.int64).max
_COL = {name: i for i, name in enumerate(MEMORY_COLUMNS)}


def to_micros(value: datetime | None, default: int) -> int:
    """A naive-UTC datetime as integer microseconds since the epoch (None -> default)."""
    if value is None:
        return default
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class Shard:
    """All live records of one subject, row-aligned across every column."""

    def __init__(self, dim: int | None, capacity: int = 16) -> None:
        self.dim = dim
        self.n = 0
        self.n_dead = 0
        self.ids: list[str | None] = []
        self.rows: list[tuple[Any, ...] | None] = []
        self.row_of: dict[str, int] = {}
        self.alive = np.zeros(capacity, dtype=bool)
        self.has_vec = np.zeros(capacity, dtype=bool)
        self.vecs = np.zeros((capacity, dim), dtype=np.float32) if dim else None
        self.conf = np.zeros(capacity, dtype=np.float64)
        self.flagged = np.zeros(capacity, dtype=bool)
        self.vfrom = np.zeros(capacity, dtype=np.int64)
        self.vuntil = np.zeros(capacity, dtype=np.int64)
        self.lex = LexicalIndex()

    # -- growth -------------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        need = self.n + extra
        cap = len(self.alive)
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        for name in ("alive", "has_vec", "conf", "flagged", "vfrom", "vuntil"):
            arr = getattr(self, name)
            new = np.zeros(cap, dtype=arr.dtype)
            new[: self.n] = arr[: self.n]
            setattr(self, name, new)
        if self.vecs is not None:
            new = np.zeros((cap, self.dim), dtype=np.float32)
            new[: self.n] = self.vecs[: self.n]
            self.vecs = new

    # -- mutation -------------------------------------------------------------
    def _set_meta(self, row: int, rec: tuple[Any, ...]) -> None:
        self.rows[row] = rec
        self.conf[row] = rec[_COL["confidence"]]
        self.flagged[row] = rec[_COL["review_state"]] in FLAGGED_STATES
        self.vfrom[row] = to_micros(rec[_COL["valid_from"]], _MIN)
        self.vuntil[row] = to_micros(rec[_COL["valid_until"]], _MAX)

    def append_many(self, recs: Sequence[tuple[Any, ...]], vecs: np.ndarray | None) -> None:
        """Append records (MEMORY_COLUMNS tuples) with their normalized vectors (or None)."""
        self._reserve(len(recs))
        start = self.n
        for i, rec in enumerate(recs):
            row = start + i
            mid = rec[0]
            if mid in self.row_of:  # defensive: a re-added id retires its old row
                self.retire(mid)
            self.ids.append(mid)
            self.rows.append(None)
            self._set_meta(row, rec)
            self.row_of[mid] = row
            self.alive[row] = True
            self.lex.add(row, rec[_COL["text"]])
        self.n = start + len(recs)
        if vecs is not None and self.vecs is not None:
            vecs = np.asarray(vecs, dtype=np.float32).reshape(len(recs), -1)
            self.vecs[start : self.n] = vecs
            self.has_vec[start : self.n] = np.linalg.norm(vecs, axis=1) > 0

    def update_meta(self, rec: tuple[Any, ...]) -> None:
        """Apply a change that keeps the text (flag, confidence, window, tags...)."""
        row = self.row_of[rec[0]]
        self._set_meta(row, rec)

    def retire(self, memory_id: str) -> None:
        """Remove a record from every future result (forget, purge, or a text change)."""
        row = self.row_of.pop(memory_id, None)
        if row is None:
            return
        rec = self.rows[row]
        self.lex.remove(row, rec[_COL["text"]] if rec else "")
        self.alive[row] = False
        self.rows[row] = None
        self.ids[row] = None
        self.n_dead += 1

    def needs_compaction(self) -> bool:
        return self.n_dead > 256 and self.n_dead * 2 > self.n

    def compacted(self) -> "Shard":
        """A fresh shard with only live rows (postings and statistics rebuilt)."""
        keep = np.flatnonzero(self.alive[: self.n])
        new = Shard(self.dim, capacity=max(16, len(keep)))
        recs = [self.rows[i] for i in keep]
        vecs = self.vecs[keep] if self.vecs is not None else None
        new.append_many(recs, vecs)  # type: ignore[arg-type]
        if self.vecs is not None:
            new.has_vec[: len(keep)] = self.has_vec[keep]
        return new

    # -- queries -------------------------------------------------------------
    def similarities(self, query: np.ndarray) -> np.ndarray:
        """Cosine of every row with the (normalized) query; rows without a vector get 0."""
        assert self.vecs is not None
        return self.vecs[: self.n] @ query

    def indexed_count(self) -> int:
        return int(np.count_nonzero(self.has_vec[: self.n] & self.alive[: self.n]))


class VectorIndex:
    """All shards of one store, keyed by subject; `dim` None means no embedder."""

    def __init__(self, dim: int | None) -> None:
        self.dim = dim
        self.shards: dict[str, Shard] = {}

    def shard(self, subject: str) -> Shard | None:
        shard = self.shards.get(subject)
        if shard is not None and shard.needs_compaction():
            shard = self.shards[subject] = shard.compacted()
        return shard

    def add_many(self, recs: Sequence[tuple[Any, ...]], vecs: np.ndarray | None) -> None:
        """Add records, grouped by subject, keeping input order within each subject."""
        groups: dict[str, list[int]] = {}
        for i, rec in enumerate(recs):
            groups.setdefault(rec[_COL["subject"]], []).append(i)
        for subject, idx in groups.items():
            shard = self.shards.get(subject)
            if shard is None:
                shard = self.shards[subject] = Shard(self.dim)
            shard.append_many([recs[i] for i in idx], None if vecs is None else vecs[idx])

    def update_meta(self, rec: tuple[Any, ...]) -> None:
        shard = self.shards.get(rec[_COL["subject"]])
        if shard is not None and rec[0] in shard.row_of:
            shard.update_meta(rec)

    def retire(self, subject: str, memory_id: str) -> None:
        shard = self.shards.get(subject)
        if shard is not None:
            shard.retire(memory_id)

    def __len__(self) -> int:
        return sum(len(s.row_of) for s in self.shards.values())
