"""The Memory's index and its shard files: open, verify, rebuild what is stale, save.

Opening a store computes the table's fingerprint per subject (one GROUP BY,
fingerprint.py) and compares it with the manifest of the shard files
(persist.py). A subject whose file matches is mapped when a search first needs
it; a subject whose file is missing, torn, of another embedder or simply
behind the table (a crash before the last save, a change made with plain SQL)
is rebuilt from DuckDB — DuckDB is the source of truth and a file is never
trusted on its word.

While the process runs, every change made through `Memory` updates the
in-memory shards and the expected fingerprint. `save()` (called by
`Memory.close()`, so by `Store.close()`) re-checks that fingerprint against the
table for each changed subject, rebuilds a subject that changed behind the
index's back, and writes the changed subjects' files and the manifest.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb
import numpy as np

from . import binding, fingerprint, sql
from .embedders import Embedder
from .errors import EmbedderMismatchError
from .fingerprint import Fingerprint
from .index import Shard, VectorIndex
from .persist import ShardFileError, load_shard, read_manifest, save_shard, write_manifest
from .tables import MEMORY_COLUMNS
from .vectors import INT8_MIN_ROWS, int8_kernel

__all__ = ["IndexCache"]

_EMBEDDER_ID = MEMORY_COLUMNS.index("embedder_id")


def _random_access(entry: dict[str, Any]) -> tuple[str, ...]:
    """Shards scanned in int8 read float32 vectors only to re-rank a few rows: read those, never map them."""
    big = int(entry.get("rows", 0)) >= INT8_MIN_ROWS
    return ("vec_f32",) if big and int8_kernel() is not None else ()


class IndexCache:
    """Owns the in-process index of one Memory and the shard files that persist it."""

    def __init__(self, con: duckdb.DuckDBPyConnection, *, folder: Path | None, writable: bool,
                 ops: Any = sql) -> None:
        self.con = con
        self.ops = ops  # the store's memory SQL (memory/sql.py, or PostgreSQL's)
        self.folder = folder
        self.writable = writable
        self.index: VectorIndex | None = None
        self.embedder: Embedder | None = None
        self.fp: dict[str, Fingerprint] = {}
        self.manifest: dict[str, Any] = {"shards": {}}
        self.rebuilt: list[str] = []  # subjects the last open/save had to rebuild from DuckDB (for reports)

    # -- opening ----------------------------------------------------------------------
    def get(self, embedder: Embedder | None) -> VectorIndex:
        if self.index is None:
            self.open(embedder)
        assert self.index is not None
        return self.index

    def open(self, embedder: Embedder | None) -> VectorIndex:
        """Map what the files hold and is current; rebuild the rest from DuckDB."""
        self.embedder = embedder
        dim = embedder.dim if embedder else None
        eid = embedder.embedder_id if embedder else None
        db_fp = fingerprint.by_subject(self.con)
        old = read_manifest(self.folder) if self.folder is not None else None
        if old is not None and (old.get("embedder_id") != eid or old.get("dim") != dim):
            old = None  # files of another vector space: not comparable, rebuild
        self.manifest = {"embedder_id": eid, "dim": dim, "shards": {}}
        self.fp = dict(db_fp)
        self.index = index = VectorIndex(dim)
        stale = []
        for subject, fp in db_fp.items():
            entry = (old or {}).get("shards", {}).get(subject)
            if entry is not None and tuple(entry.get("fp", ())) == fp:
                self.manifest["shards"][subject] = entry
                index.loaders[subject] = functools.partial(self._load, subject, embedder)
            else:
                stale.append(subject)
        self.rebuilt = list(stale)
        if stale:
            self.rebuild(embedder, stale)
        return index

    def _load(self, subject: str, embedder: Embedder | None) -> Shard:
        assert self.index is not None and self.folder is not None
        entry = self.manifest["shards"][subject]
        try:
            arrays, vocab = load_shard(self.folder / entry["file"], subject, tuple(entry["fp"]),
                                       _random_access(entry))
        except ShardFileError:
            self.manifest["shards"].pop(subject, None)
            self.rebuilt.append(subject)
            shard = self._build(embedder, [subject]).get(subject) or Shard(self.index.dim)
            self.fp.update(fingerprint.by_subject(self.con, [subject]))
            return shard
        shard = Shard(self.index.dim, arrays, vocab)
        shard.dirty = False
        return shard

    def rebuild(self, embedder: Embedder | None, subjects: Sequence[str] | None = None) -> int:
        """Rebuild the given subjects (None: all) from DuckDB, then save them; returns live records indexed."""
        if self.index is None or subjects is None:
            self.index = VectorIndex(embedder.dim if embedder else None)
            self.manifest = {"embedder_id": embedder.embedder_id if embedder else None,
                             "dim": self.index.dim, "shards": {}}
        self.embedder = embedder
        shards = self._build(embedder, subjects)
        fresh = fingerprint.by_subject(self.con, subjects)  # after any vectors were filled in
        if subjects is None:
            self.fp = fresh
        for subject in subjects or []:
            if subject in fresh:
                self.fp[subject] = fresh[subject]
            else:
                self.fp.pop(subject, None)
        for subject in (fresh if subjects is None else subjects):
            self.index.loaders.pop(subject, None)
            self.manifest["shards"].pop(subject, None)
            self.index.shards[subject] = shards.get(subject) or Shard(self.index.dim)
        self.save()
        return sum(s.live_count() for s in shards.values())

    def _build(self, embedder: Embedder | None, subjects: Sequence[str] | None) -> dict[str, Shard]:
        """Shards for the subjects' live rows, read from DuckDB (records without a vector are embedded)."""
        recs, vecs = self.ops.load_live(self.con, subjects)
        dim = embedder.dim if embedder else None
        matrix = None
        if dim is not None and embedder is not None:
            matrix = np.zeros((len(recs), dim), dtype=np.float32)
            missing = []
            for i, v in enumerate(vecs):
                if v is None:
                    missing.append(i)
                elif len(v) != dim:
                    raise EmbedderMismatchError(f"memory {recs[i][0]} has a vector of dim {len(v)}, expected {dim}")
                else:
                    matrix[i] = v
            if missing:
                new = binding.embed(embedder, [recs[i][2] for i in missing])
                assert new is not None
                matrix[missing] = new
                if self.writable:
                    with self.ops.transaction(self.con):
                        self.ops.write_embeddings(self.con, [recs[i][0] for i in missing], new, embedder.embedder_id)
                        binding.bind(self.con, embedder)
                for i in missing:
                    recs[i] = recs[i][:_EMBEDDER_ID] + (embedder.embedder_id,) + recs[i][_EMBEDDER_ID + 1:]
        built = VectorIndex(dim)
        built.add_many(recs, matrix)
        return built.shards

    # -- keeping in step ------------------------------------------------------------------
    def invalidate(self) -> None:
        """Drop the in-process index (it may hold rows a failed commit never wrote): the next use re-opens it."""
        self.index = None

    def note(self, *parts: Iterable[tuple[str, Fingerprint, int]]) -> None:
        """Apply fingerprint changes of rows written through the Memory (see fingerprint.combine)."""
        fingerprint.combine(self.fp, *parts)
        for subject in [s for s, (n, _) in self.fp.items() if n == 0]:
            del self.fp[subject]  # every row purged: the table has no such subject any more

    # -- saving -----------------------------------------------------------------------------
    def save(self) -> list[str]:
        """Write the files of changed subjects (checked against DuckDB first); returns the subjects written."""
        if self.index is None or not self.writable or self.folder is None:
            return []
        index = self.index
        changed = [s for s, shard in index.shards.items() if shard.dirty]
        changed += [s for s in self.fp if s not in self.manifest["shards"] and s not in index.shards
                    and s not in index.loaders]
        changed += [s for s in self.manifest["shards"] if s not in self.fp]
        if not changed:
            return []
        table = fingerprint.by_subject(self.con, changed)
        behind = [s for s in changed if table.get(s) != self.fp.get(s)]
        if behind:  # the table changed without the index: DuckDB wins
            self.rebuilt += behind
            shards = self._build(self.embedder, behind)
            table.update(fingerprint.by_subject(self.con, behind))
            for s in behind:
                index.shards[s] = shards.get(s) or Shard(index.dim)
        for subject in changed:
            if subject not in table:  # no rows left at all
                self.fp.pop(subject, None)
                self.manifest["shards"].pop(subject, None)
                index.shards.pop(subject, None)
                continue
            self.fp[subject] = table[subject]
            shard = index.shards.get(subject) or Shard(index.dim)
            arrays, vocab = shard.arrays()
            name = save_shard(self.folder, subject, table[subject], arrays, vocab)
            entry = self.manifest["shards"][subject] = {"file": name, "fp": list(table[subject]),
                                                        "rows": int(len(arrays["ids"]))}
            loaded = Shard(index.dim, *load_shard(self.folder / name, subject, table[subject],
                                                  _random_access(entry)))
            loaded.dirty = False
            index.shards[subject] = loaded  # the mapped file replaces the in-memory copy (less resident memory)
        write_manifest(self.folder, self.manifest)
        return changed
