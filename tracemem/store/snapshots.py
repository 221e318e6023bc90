"""Run snapshots: each recorded run's query text and embedding, and exact similar-run search.

A pipeline declares which scope path is its question (`Pipeline(..., query="question")`).
The store embeds that text when it writes the run (in the background writer, off
the hot path) and keeps, per (pipeline, embedder id), an L2-normalized numpy
matrix in step with the `run_embeddings` table for exact top-k cosine search.
"""
from __future__ import annotations

from .rows import first as _first

import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from ..run import Run


def embedding_rows(embedder: Any, runs: Sequence[Run]) -> list[tuple]:
    """`run_embeddings` rows for the runs that carry a query (one embedder call for all)."""
    todo = [r for r in runs if r.query and r.parent_run_id is None]
    if not todo or embedder is None:
        return []
    vectors = np.asarray(embedder.embed([r.query for r in todo]), dtype=np.float32)
    now = time.time_ns()
    return [(r.run_id, r.pipeline, embedder.embedder_id, r.query, v.tolist(), now) for r, v in zip(todo, vectors)]


class SnapshotIndex:
    """Exact cosine search over past runs' query embeddings, per (pipeline, embedder id)."""

    def __init__(self, con: Any, lock: threading.RLock) -> None:
        self.con = con
        self.lock = lock
        self._cache: dict[tuple[str, str], tuple[int, list[str], list[str], np.ndarray]] = {}

    def _matrix(self, pipeline: str, embedder_id: str) -> tuple[list[str], list[str], np.ndarray]:
        key = (pipeline, embedder_id)
        with self.lock:
            count = _first(self.con.execute("SELECT count(*) FROM run_embeddings WHERE pipeline = ? AND embedder_id = ?",
                                     [pipeline, embedder_id]))[0]
            cached = self._cache.get(key)
            if cached is not None and cached[0] == count:
                return cached[1], cached[2], cached[3]
            offset = cached[0] if cached is not None else 0
            table = self.con.sql(
                "SELECT run_id, query, embedding FROM run_embeddings WHERE pipeline = ? AND embedder_id = ? "
                "ORDER BY created_at, run_id OFFSET ?", params=[pipeline, embedder_id, offset]).to_arrow_table()
        ids = table.column("run_id").to_pylist()
        queries = table.column("query").to_pylist()
        if ids:
            flat = table.column("embedding").combine_chunks()
            dim = len(flat[0]) if len(flat) else 0
            new = np.asarray(flat.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)
            norms = np.linalg.norm(new, axis=1, keepdims=True)
            new = new / np.where(norms == 0, 1, norms)
        else:
            new = np.zeros((0, 0), dtype=np.float32)
        if cached is not None and cached[3].size:
            ids, queries = cached[1] + ids, cached[2] + queries
            new = np.vstack([cached[3], new]) if new.size else cached[3]
        self._cache[key] = (count, ids, queries, new)
        return ids, queries, new

    def similar(self, pipeline: str, embedder_id: str, vector: np.ndarray, *, top_k: int = 1,
                exclude: Sequence[str] = ()) -> list[tuple[str, str, float]]:
        """(run_id, query, cosine) of the most similar past runs, best first."""
        ids, queries, matrix = self._matrix(pipeline, embedder_id)
        if not ids:
            return []
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != matrix.shape[1]:
            return []
        norm = float(np.linalg.norm(q))
        scores = matrix @ (q / norm if norm else q)
        skip = set(exclude)
        k = min(len(ids), top_k + len(skip))
        best = np.argpartition(-scores, k - 1)[:k] if k < len(ids) else np.arange(len(ids))
        best = best[np.argsort(-scores[best], kind="stable")]
        out = [(ids[i], queries[i], float(scores[i])) for i in best if ids[i] not in skip]
        return out[:top_k]
