"""The in-process index: per-subject shards of numpy columns, vectors and lexical statistics.

Why in-process numpy: an exact top-k over 100k x 384 is one matrix-vector
product, about ten times faster than a scan in DuckDB.
Why per subject: every search is scoped to one subject, so a shard is the
natural unit — a search touches only its subject's rows (no other subject's
record can ever be scored, let alone returned), and the filters (forgotten,
flagged, confidence, validity window) are numpy columns applied before any
top-k cut.

Why no records in it: a shard holds ids, filter columns, vectors and term
statistics only — everything a ranking needs and nothing a result needs. The
records a search returns are read from DuckDB by id, so a million records
cost arrays, not a million Python tuples, and the index loads from a file
(persist.py) without parsing a row.

The index is a cache of the `memories` table, kept in step by the Memory class
on every change. Rows are append-only; a changed text appends a new row and
retires the old one; shards compact themselves when half their rows are retired.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

import numpy as np

from .lexical import LexicalIndex
from .records import FLAGGED_STATES, REVIEW_STATES
from .tables import MEMORY_COLUMNS
from .text import term_tuple
from .vectors import Vectors

__all__ = ["Shard", "VectorIndex", "to_micros", "from_micros", "MIN_US", "MAX_US", "REVIEW_CODE", "FLAGGED_CODE"]

_EPOCH = datetime(1970, 1, 1)
MIN_US = int(np.iinfo(np.int64).min)
MAX_US = int(np.iinfo(np.int64).max)
_COL = {name: i for i, name in enumerate(MEMORY_COLUMNS)}
REVIEW_CODE = {state: i for i, state in enumerate(REVIEW_STATES)}
FLAGGED_CODE = np.array([s in FLAGGED_STATES for s in REVIEW_STATES])
_META = ("alive", "has_vec", "conf", "review", "vfrom", "vuntil")
_DTYPES = {"alive": bool, "has_vec": bool, "conf": np.float64, "review": np.uint8, "vfrom": np.int64,
           "vuntil": np.int64}


def to_micros(value: datetime | None, default: int) -> int:
    """A naive-UTC datetime as integer microseconds since the epoch (None -> default)."""
    if value is None:
        return default
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(us: int) -> datetime | None:
    return None if us in (MIN_US, MAX_US) else _EPOCH + timedelta(microseconds=int(us))


class Shard:
    """All live records of one subject, row-aligned across every column."""

    def __init__(self, dim: int | None, arrays: Mapping[str, np.ndarray] | None = None,
                 vocab: list[str] | None = None) -> None:
        self.dim = dim
        a = arrays or {}
        base_ids = a.get("ids")
        self.n = 0 if base_ids is None else len(base_ids)
        self.n_dead = 0
        self._base_ids = base_ids if base_ids is not None else np.zeros(0, dtype="S1")
        self._tail_ids: list[str | None] = []
        self._row_of: dict[str, int] | None = None
        for name in _META:  # small columns are copied: they change in place (flag, forget, ...)
            col = np.zeros(max(16, self.n), dtype=_DTYPES[name])
            if name == "alive":
                col[: self.n] = True
            elif self.n:
                col[: self.n] = a[name]
            setattr(self, name, col)
        self.vecs = Vectors(dim, a) if dim else None
        self.lex = LexicalIndex(arrays=a, vocab=vocab)
        self.dirty = arrays is None  # a new shard has nothing on disk yet
        self.version = 0  # bumped by every change of a row's filter columns or liveness (keys `memo`)
        self.memo: dict[str, Any] = {}  # values derived from the rows by search, each stored with its key

    @property
    def flagged(self) -> np.ndarray:
        return FLAGGED_CODE[self.review[: self.n]]

    # -- ids -----------------------------------------------------------------------
    def id_at(self, row: int) -> str | None:
        if row < len(self._base_ids):
            return self._base_ids[row].decode("utf-8") if self.alive[row] else None
        return self._tail_ids[row - len(self._base_ids)]

    def row_of(self, memory_id: str) -> int | None:
        """The live row of a record (the id -> row map is built on first use)."""
        if self._row_of is None:
            base = self._base_ids
            self._row_of = {m.decode("utf-8"): i for i, m in enumerate(base.tolist()) if self.alive[i]}
            for i, mid in enumerate(self._tail_ids):
                if mid is not None:
                    self._row_of[mid] = len(self._base_ids) + i
        return self._row_of.get(memory_id)

    def live_count(self) -> int:
        return self.n - self.n_dead

    # -- mutation --------------------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        need = self.n + extra
        if need <= len(self.alive):
            return
        cap = max(need, 2 * len(self.alive))
        for name in _META:
            arr = getattr(self, name)
            new = np.zeros(cap, dtype=arr.dtype)
            new[: self.n] = arr[: self.n]
            setattr(self, name, new)

    def _set_meta(self, start: int, recs: Sequence[Sequence[Any]]) -> None:
        """The filter columns of rows start, start+1, ... from their records, a column at a time."""
        end = start + len(recs)
        self.conf[start:end] = [rec[_COL["confidence"]] for rec in recs]
        self.review[start:end] = [REVIEW_CODE[rec[_COL["review_state"]]] for rec in recs]
        self.vfrom[start:end] = [to_micros(rec[_COL["valid_from"]], MIN_US) for rec in recs]
        self.vuntil[start:end] = [to_micros(rec[_COL["valid_until"]], MAX_US) for rec in recs]
        self.version += 1
        self.dirty = True

    def append_many(self, recs: Sequence[Sequence[Any]], vecs: np.ndarray | None) -> None:
        """Append records (MEMORY_COLUMNS tuples) with their normalized vectors (or None)."""
        self._reserve(len(recs))
        start, end = self.n, self.n + len(recs)
        ids = [rec[0] for rec in recs]
        for mid in ids:
            if self.row_of(mid) is not None:  # defensive: a re-added id retires its old row
                self.retire(mid)
        assert self._row_of is not None
        self._tail_ids.extend(ids)
        self._row_of.update(zip(ids, range(start, end)))
        self._set_meta(start, recs)
        self.alive[start : start + len(recs)] = True
        self.lex.add_many(start, [term_tuple(rec[_COL["text"]]) for rec in recs])
        self.n = start + len(recs)
        if self.vecs is not None:
            block = np.zeros((len(recs), self.vecs.dim), dtype=np.float32) if vecs is None else \
                np.asarray(vecs, dtype=np.float32).reshape(len(recs), -1)
            self.vecs.append(block)
            self.has_vec[start : self.n] = vecs is not None and np.linalg.norm(block, axis=1) > 0
        self.dirty = True

    def retire(self, memory_id: str) -> None:
        """Remove a record from every future result (forget, purge, or a text change)."""
        row = self.row_of(memory_id)
        if row is None:
            return
        assert self._row_of is not None
        del self._row_of[memory_id]
        self.lex.remove(row)
        self.alive[row] = False
        if row >= len(self._base_ids):
            self._tail_ids[row - len(self._base_ids)] = None
        self.n_dead += 1
        self.version += 1
        self.dirty = True

    def needs_compaction(self) -> bool:
        return self.n_dead > 256 and self.n_dead * 2 > self.n

    def arrays(self) -> tuple[dict[str, np.ndarray], list[str]]:
        """The live rows as one fresh block of arrays (for a shard file, or a compacted shard)."""
        keep = np.flatnonzero(self.alive[: self.n])
        n_base = len(self._base_ids)
        base_keep, tail_keep = keep[keep < n_base], keep[keep >= n_base]
        tail_ids = [str(self._tail_ids[int(r) - n_base]).encode("utf-8") for r in tail_keep]
        ids = np.concatenate([self._base_ids[base_keep], np.array(tail_ids, dtype="S")]) if tail_ids else \
            np.array(self._base_ids[base_keep])
        out: dict[str, np.ndarray] = {"ids": ids}
        for name in _META:
            if name != "alive":
                out[name] = getattr(self, name)[keep]
        if self.vecs is not None:
            out.update(self.vecs.arrays(keep))
        lex, vocab = self.lex.arrays(keep)
        return {**out, **lex}, vocab

    def compacted(self) -> "Shard":
        """A fresh shard with only live rows (postings and statistics rebuilt, no text re-read)."""
        arrays, vocab = self.arrays()
        new = Shard(self.dim, arrays, vocab)
        new.dirty = True
        return new

    # -- queries -------------------------------------------------------------------------
    def indexed_count(self) -> int:
        key = (self.version, self.n)  # has_vec changes only with appended rows, alive with retired ones
        if self.memo.get("indexed_key") != key:
            self.memo["indexed_key"] = key
            self.memo["indexed"] = int(np.count_nonzero(self.has_vec[: self.n] & self.alive[: self.n]))
        return self.memo["indexed"]


class VectorIndex:
    """All shards of one store, keyed by subject; `dim` None means no embedder.

    `loaders` holds subjects whose shard file is known good but not yet mapped:
    a search maps only its own subject's file.
    """

    def __init__(self, dim: int | None) -> None:
        self.dim = dim
        self.shards: dict[str, Shard] = {}
        self.loaders: dict[str, Any] = {}

    def shard(self, subject: str) -> Shard | None:
        shard = self.shards.get(subject)
        if shard is None and subject in self.loaders:
            shard = self.shards[subject] = self.loaders.pop(subject)()
        if shard is not None and shard.needs_compaction():
            shard = self.shards[subject] = shard.compacted()
        return shard

    def add_many(self, recs: Sequence[Sequence[Any]], vecs: np.ndarray | None) -> None:
        """Add records, grouped by subject, keeping input order within each subject."""
        groups: dict[str, list[int]] = {}
        for i, rec in enumerate(recs):
            groups.setdefault(rec[_COL["subject"]], []).append(i)
        for subject, idx in groups.items():
            shard = self.shard(subject)
            if shard is None:
                shard = self.shards[subject] = Shard(self.dim)
            shard.append_many([recs[i] for i in idx], None if vecs is None else vecs[idx])

    def retire(self, subject: str, memory_id: str) -> None:
        shard = self.shard(subject)
        if shard is not None:
            shard.retire(memory_id)

    def __len__(self) -> int:
        """Live records in the shards mapped so far (files not yet mapped are not counted)."""
        return sum(s.live_count() for s in self.shards.values())
