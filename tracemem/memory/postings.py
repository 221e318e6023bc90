"""How a shard's lexical index is stored: term ids, which rows hold a term, which terms a row holds.

Why arrays: the statistics of a million records must load without re-tokenizing a
single text. Terms get shard-local ids (`Vocabulary`). The postings of the rows
present when the shard was built (or loaded from its file) are one CSR block, and
rows added since go to small per-term arrays (`InvertedLists`); the forward lists
(`ForwardLists`, row -> term ids) let a removed row leave the document
frequencies, and pseudo-relevance feedback read a record's terms, without the text.
Nothing here knows BM25 (bm25.py weighs what is stored here).
"""

from __future__ import annotations

from array import array
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

__all__ = ["Vocabulary", "CsrBlock", "InvertedLists", "ForwardLists", "csr"]

_EMPTY_I = np.zeros(0, dtype=np.int32)
_EMPTY_F = np.zeros(0, dtype=np.float32)


def csr(groups: np.ndarray, values: Sequence[np.ndarray], n_groups: int) -> tuple[np.ndarray, ...]:
    """Offsets (n_groups + 1) and the values re-ordered by group (stable within a group)."""
    order = np.argsort(groups, kind="stable")
    off = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(groups, minlength=n_groups), out=off[1:])
    return (off, *(v[order] for v in values))


class Vocabulary:
    """A shard's terms by id, ids given in order of first use; the term -> id map is built on first use
    (a loaded shard may never be queried)."""

    def __init__(self, terms: list[str]) -> None:
        self.terms = terms
        self._ids: dict[str, int] | None = None

    def ids(self) -> dict[str, int]:
        if self._ids is None:
            self._ids = {t: i for i, t in enumerate(self.terms)}
        return self._ids

    def lookup(self, terms: Iterable[str]) -> list[int]:
        """Ids of the distinct known terms, in query order (unknown terms match nothing)."""
        ids = self.ids()
        out = [ids.get(t) for t in dict.fromkeys(terms)]
        return [i for i in out if i is not None]

    def add(self, terms: Sequence[str]) -> dict[str, int]:
        """Give the new terms ids, in order of first use; returns the id of every term."""
        ids = self.ids()
        for t in dict.fromkeys([t for t in terms if t not in ids]):
            ids[t] = len(self.terms)
            self.terms.append(t)
        return ids


class CsrBlock(NamedTuple):
    """Groups of (id, count) pairs as three arrays, as a shard file stores them: group i is
    `ids[off[i]:off[i + 1]]` with the counts at the same places."""

    off: np.ndarray
    ids: np.ndarray
    counts: np.ndarray

    @classmethod
    def load(cls, arrays: Mapping[str, np.ndarray], off: str, ids: str, counts: str) -> "CsrBlock":
        """The block stored under these names (an empty one where there is none)."""
        return cls(arrays.get(off, np.zeros(1, dtype=np.int64)), arrays.get(ids, _EMPTY_I), arrays.get(counts, _EMPTY_F))

    def size(self) -> int:
        """How many groups it holds."""
        return len(self.off) - 1

    def group(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.off[i], self.off[i + 1]
        return self.ids[lo:hi], self.counts[lo:hi]


class InvertedLists:
    """Term -> the rows holding it (ascending) and its count in each: a CSR block plus per-term tails."""

    def __init__(self, base: CsrBlock) -> None:
        self.base = base  # by term: the rows present when the shard was built or loaded
        self.n_base_terms = base.size()
        self._tail: dict[int, tuple[array, array]] = {}  # term -> rows ('i'), counts ('f'): no Python objects
        self._joined: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # base and tail as one array, per term

    def append(self, rows: np.ndarray, tids: np.ndarray, counts: np.ndarray) -> None:
        """Add postings (rows above every row held so far, in ascending order within each term)."""
        order = np.argsort(tids, kind="stable")  # group the new postings by term, rows ascending within
        by_term = tids[order]
        by_row = memoryview(rows[order].astype(np.int32)).cast("B")  # raw bytes, 4 per posting
        by_count = memoryview(np.ascontiguousarray(counts[order], dtype=np.float32)).cast("B")
        cuts = np.flatnonzero(np.diff(by_term)) + 1
        firsts = np.concatenate([[0], cuts]).tolist()
        lasts = np.concatenate([cuts, [len(by_term)]]).tolist()
        for tid, a, b in zip(by_term[firsts].tolist() if len(by_term) else [], firsts, lasts):
            post = self._tail.get(tid)
            if post is None:
                post = self._tail[tid] = (array("i"), array("f"))
            post[0].frombytes(by_row[4 * a : 4 * b])
            post[1].frombytes(by_count[4 * a : 4 * b])
            self._joined.pop(tid, None)

    def of(self, tid: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows holding a term, live or not, and its counts in them."""
        hit = self._joined.get(tid)
        if hit is None:
            parts_r, parts_t = [], []
            if tid < self.n_base_terms:
                rows, counts = self.base.group(tid)
                parts_r.append(rows)
                parts_t.append(counts)
            tail = self._tail.get(tid)
            if tail:
                parts_r.append(np.frombuffer(tail[0], dtype=np.int32).copy())  # a copy: the tail keeps growing
                parts_t.append(np.frombuffer(tail[1], dtype=np.float32).copy())
            hit = (np.concatenate(parts_r), np.concatenate(parts_t)) if len(parts_r) > 1 else (parts_r[0], parts_t[0])
            if tail:  # a pure slice of the base costs nothing to rebuild; keep only the joined ones
                self._joined[tid] = hit
        return hit


class ForwardLists:
    """Row -> the term ids it holds and their counts: a CSR block for the base rows, a list for the rest."""

    def __init__(self, base: CsrBlock) -> None:
        self.base = base  # by row: the rows present when the shard was built or loaded
        self.n_base_rows = base.size()
        self._tail: list[tuple[np.ndarray, np.ndarray]] = []

    def append(self, rows: np.ndarray, tids: np.ndarray, counts: np.ndarray, n_rows: int) -> None:
        """Add `n_rows` rows after the last one; `rows` gives each posting's row among them (from 0, ascending)."""
        bounds = np.searchsorted(rows, np.arange(n_rows + 1))
        self._tail.extend((tids[a:b], counts[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()))

    def of(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """A row's term ids and their counts."""
        if row < self.n_base_rows:
            return self.base.group(row)
        return self._tail[row - self.n_base_rows]

    def gather(self, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows `keep` (in order) as one run: how many terms each holds, the term ids, their counts."""
        if not self._tail:  # all rows are base rows: gather the slices with numpy
            off = self.base.off
            lens = (off[keep + 1] - off[keep]).astype(np.int64)
            starts = np.repeat(off[keep], lens)
            within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
            idx = starts + within
            return lens, self.base.ids[idx], self.base.counts[idx]
        parts = [self.of(int(r)) for r in keep]
        lens = np.fromiter((len(p[0]) for p in parts), np.int64, len(parts))
        terms = np.concatenate([p[0] for p in parts]) if parts else _EMPTY_I
        counts = np.concatenate([p[1] for p in parts]) if parts else _EMPTY_F
        return lens, terms, counts
