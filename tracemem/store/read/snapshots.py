"""Run snapshots: each recorded run's query text and embedding, and exact similar-run search.

A pipeline declares which scope path is its question (`Pipeline(..., query="question")`).
The store embeds that text when it writes the run (in the background writer, off
the hot path) and keeps, per (pipeline, embedder id), an L2-normalized numpy
matrix in step with the `run_embeddings` table for exact top-k cosine search.
"""
from __future__ import annotations


import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ...errors import TracememError

Follow = Callable[[str, str, int], tuple[int, list[tuple[str, str, Any]]]]


def embedding_rows(embedder: Any, runs: Sequence[Any]) -> list[tuple]:
    """`run_embeddings` rows for the finished, successful runs that carry a query (one embedder call
    for all): a failed run is never offered to load_snapshot as past experience, nor a counterfactual
    run (a what-if, not something that happened). Each run is a `Run`, or what the writer keeps of one
    (its run id, pipeline, query, status, parent run id and counterfactual)."""
    todo = [r for r in runs if r.query and r.parent_run_id is None and r.status == "ok" and r.counterfactual is None]
    if not todo or embedder is None:
        return []
    vectors = np.asarray(embedder.embed([r.query for r in todo]), dtype=np.float32)
    now = time.time_ns()
    return [(r.run_id, r.pipeline, embedder.embedder_id, r.query, v.tolist(), now) for r, v in zip(todo, vectors)]


class SnapshotIndex:
    """Exact cosine search over past runs' query embeddings, per (pipeline, embedder id).

    The matrix is loaded from `run_embeddings` once (through Arrow) and then kept in
    step by `added()`, which the store calls after each insert: this process is the
    file's only writer, so no query has to ask DuckDB what changed.
    """

    def __init__(self, con: Any, lock: threading.RLock, follow: Optional[Follow] = None) -> None:
        self.con = con
        self.lock = lock
        # a store many processes write (PostgreSQL) follows the table instead: `follow(pipeline, embedder_id,
        # after)` returns the rows committed after position `after`, and the position reached
        self.follow = follow
        self._cache: dict[tuple[str, str], _Entry] = {}

    def added(self, rows: Sequence[tuple]) -> None:
        """New `run_embeddings` rows (run_id, pipeline, embedder_id, query, embedding, created_at)."""
        if self.follow is not None:
            return  # read back with every other process's rows by the next search
        for run_id, pipeline, embedder_id, query, embedding, _ in rows:
            entry = self._cache.get((pipeline, embedder_id))
            if entry is not None:
                entry.pending.append((run_id, query, embedding))

    def reset(self) -> None:
        """Forget what is loaded (rows were added behind the index's back, e.g. by `tracemem copy`)."""
        with self.lock:
            self._cache.clear()

    def _entry(self, pipeline: str, embedder_id: str) -> "_Entry":
        key = (pipeline, embedder_id)
        with self.lock:
            entry = self._cache.get(key)
            if self.follow is not None:
                if entry is None:
                    entry = self._cache[key] = _Entry([], [], np.zeros((0, 0), dtype=np.float32))
                entry.seen, rows = self.follow(pipeline, embedder_id, entry.seen)
                entry.pending += [r for r in rows if r[0] not in entry.known]
                entry.known.update(r[0] for r in rows)
            elif entry is None:
                table = self.con.sql(
                    "SELECT run_id, query, embedding FROM run_embeddings WHERE pipeline = ? AND embedder_id = ? "
                    "ORDER BY created_at, run_id", params=[pipeline, embedder_id]).to_arrow_table()
                entry = self._cache[key] = _Entry(table.column("run_id").to_pylist(),
                                                  table.column("query").to_pylist(), _matrix(table))
            if entry.pending:
                pending, entry.pending = entry.pending, []
                rows = np.asarray([p[2] for p in pending], dtype=np.float32)
                entry.ids += [p[0] for p in pending]
                entry.queries += [p[1] for p in pending]
                entry.matrix = _normalize(rows) if entry.matrix.size == 0 else np.vstack([entry.matrix, _normalize(rows)])
            return entry

    def similar(self, pipeline: str, embedder_id: str, vector: np.ndarray, *, top_k: int = 1,
                exclude: Sequence[str] = ()) -> list[tuple[str, str, float]]:
        """(run_id, query, cosine) of the most similar past runs, best first."""
        entry = self._entry(pipeline, embedder_id)
        ids, queries, matrix = entry.ids, entry.queries, entry.matrix
        if not ids:
            return []
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != matrix.shape[1]:
            raise TracememError(
                f"query vector has {q.shape[0]} dimensions but runs of '{pipeline}' embedded with '{embedder_id}' "
                f"have {matrix.shape[1]}; one embedder id must always mean one vector space")
        norm = float(np.linalg.norm(q))
        scores = matrix @ (q / norm if norm else q)
        skip = set(exclude)
        k = min(len(ids), top_k + len(skip))
        best = np.argpartition(-scores, k - 1)[:k] if k < len(ids) else np.arange(len(ids))
        best = best[np.argsort(-scores[best], kind="stable")]
        out = [(ids[i], queries[i], float(scores[i])) for i in best if ids[i] not in skip]
        return out[:top_k]


class _Entry:
    def __init__(self, ids: list[str], queries: list[str], matrix: np.ndarray) -> None:
        self.ids, self.queries, self.matrix = ids, queries, matrix
        self.pending: list[tuple[str, str, Any]] = []
        self.seen = 0  # followed stores: the position in the table read up to
        self.known: set[str] = set()  # followed stores: run ids already taken


def _normalize(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1, norms)


def _matrix(table: Any) -> np.ndarray:
    if table.num_rows == 0:
        return np.zeros((0, 0), dtype=np.float32)
    flat = table.column("embedding").combine_chunks()
    values = np.asarray(flat.values.to_numpy(zero_copy_only=False), dtype=np.float32)
    return _normalize(values.reshape(table.num_rows, -1))
