"""One shard's vectors, and the similarity scan over them.

Rows loaded from a shard file (the base) are memory-mapped float32, plus an
int8 copy (one scale per row); rows added since live in a growing float32
array. Why int8: at a million rows a float32 scan reads 1.5 GB per query and
keeps it resident; the int8 scan reads 0.4 GB, and only that stays resident.

Below `INT8_MIN_ROWS` (and whenever the optional `numkong` kernel is missing)
the scan is float32 with numpy's BLAS: exact. From it on the scan is int8 and
approximate (cosines off by ~0.001-0.01): search re-ranks the best candidates
with their float32 vectors (`exact`), so the scores it reports are float32
scores, but a record the int8 estimate placed outside that pool can be missed,
and candidacy near `min_similarity` can differ. So the result says so:
`SearchResult.scan == "int8"`, with the top-10 recall against a float32 scan
that `measure_recall` took when the shard file was written (`scan_recall`).
Measured before choosing: keeping the int8 scan exact by re-scoring every row
its error bound leaves undecided touched tens of thousands of float32 rows per
query at a million records (and kept them resident).

Why 50,000: a float32 scan reads 1.5 KB a row (384 dimensions), and at 100,000
rows that is 154 MB per query, 6-15 ms here, against 1-2 ms for the int8 codes.
A fused search (BM25 leading, as with the hashing embedder) of a shard of
`PRUNED_MIN_ROWS` or more mostly does not scan at all: pruned.py bounds which
rows can reach the top and computes float32 cosines for those only; this scan
is its fallback.

The int8 kernel comes from the optional `numkong` package
(`pip install 'tracemem-agents[scale]'`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["Vectors", "TailRows", "BLOCK_ROWS", "quantize", "query_codes", "int8_kernel", "INT8_MIN_ROWS",
           "PRUNED_MIN_ROWS", "RERANK"]

INT8_MIN_ROWS = 50_000  # below this the float32 matrix is small and its scan fast: stay exact
PRUNED_MIN_ROWS = 250_000  # from this on a fused search is ranked through bounds (pruned.py), without context
RERANK = 32  # candidates re-scored in float32 beyond the k asked for (top-10 recall 1.000 at 1M, bench)


@lru_cache(maxsize=1)
def int8_kernel() -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """numkong's SIMD int8 dot product (exact integer arithmetic), or None when not installed."""
    try:
        import numkong  # type: ignore[import-not-found]
    except ImportError:
        return None

    def dots(codes: np.ndarray, q8: np.ndarray) -> np.ndarray:
        return np.asarray(numkong.cdist(q8[None], codes, metric="dot", out_dtype="float32"))[0]
    return dots


def query_codes(query: np.ndarray) -> tuple[np.ndarray, float]:
    """A query vector as int8 codes and their scale (the scale of its largest component)."""
    peak = float(np.abs(query).max())
    sq = peak / 127.0 if peak > 0 else 1.0
    return np.clip(np.rint(query / sq), -127, 127).astype(np.int8), sq


def quantize(vecs: np.ndarray, chunk: int = 65_536) -> dict[str, np.ndarray]:
    """Per-row symmetric int8 codes and their scales (chunked: no big temporaries)."""
    n = len(vecs)
    out = {"vec_i8": np.zeros((n, vecs.shape[1]), dtype=np.int8), "vec_scale": np.ones(n, dtype=np.float32)}
    for lo in range(0, n, chunk):
        v = np.asarray(vecs[lo : lo + chunk], dtype=np.float32)
        peak = np.abs(v).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        out["vec_i8"][lo : lo + chunk] = np.clip(np.rint(v / scale[:, None]), -127, 127)
        out["vec_scale"][lo : lo + chunk] = scale
    return out


BLOCK_ROWS = 16_384  # rows per block of the in-memory tail once it is big (24 MB at dim 384)


class TailRows:
    """The float32 rows added in this process, in blocks that are never moved.

    Why blocks: one array grown by doubling copied every row it held at each doubling
    (a 1.5 GB copy on the way to a million rows) and kept up to twice the memory it
    used. Blocks double in size up to `BLOCK_ROWS`, then stay that size: appending never
    copies what is there. Each row's dot product with a query is the same float32 sum
    whichever block it sits in (a matrix-vector product works row by row).
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.blocks: list[np.ndarray] = []
        self.starts: list[int] = []  # the first row of each block
        self.n = 0

    def append(self, vecs: np.ndarray) -> None:
        vecs = np.asarray(vecs, dtype=np.float32).reshape(-1, self.dim)
        done = 0
        while done < len(vecs):
            room = self.starts[-1] + len(self.blocks[-1]) - self.n if self.blocks else 0
            if room == 0:
                want = max(2 * len(self.blocks[-1]) if self.blocks else 16, len(vecs) - done)
                size = min(BLOCK_ROWS, -(-want // 16) * 16)  # whole groups of 16 rows, as a matrix kernel takes them
                self.blocks.append(np.empty((size, self.dim), dtype=np.float32))
                self.starts.append(self.n)
                room = size
            take = min(room, len(vecs) - done)
            at = self.n - self.starts[-1]
            self.blocks[-1][at : at + take] = vecs[done : done + take]
            done += take
            self.n += take

    def _filled(self) -> list[np.ndarray]:
        return [blk[: min(len(blk), self.n - start)] for blk, start in zip(self.blocks, self.starts)]

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of tail rows `rows` (0 = the first row added)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.blocks) == 1:
            return self.blocks[0][rows]
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        which = np.searchsorted(np.asarray(self.starts), rows, side="right") - 1
        for b in np.unique(which).tolist():
            hit = which == b
            out[hit] = self.blocks[b][rows[hit] - self.starts[b]]
        return out

    def dot(self, query: np.ndarray) -> np.ndarray:
        """Every tail row's dot product with `query`, in row order."""
        parts = [blk @ query for blk in self._filled()]
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


class Vectors:
    """Base rows (memory-mapped float32, optional int8 codes) followed by rows added in this process."""

    def __init__(self, dim: int, base: Mapping[str, Any] | None = None) -> None:
        self.dim = dim
        base = base or {}
        self.base: Any = base.get("vec_f32")  # an array, or a persist.RowReader (rows read on demand)
        self.n_base = 0 if self.base is None else len(self.base)
        self.codes = {k: base[k] for k in ("vec_i8", "vec_scale") if k in base}
        recall = base.get("int8_recall")
        self.int8_recall = None if recall is None or not len(recall) or np.isnan(recall[0]) else float(recall[0])
        self.tail = TailRows(dim)
        self.int8_min_rows = INT8_MIN_ROWS
        self.pruned_min_rows = PRUNED_MIN_ROWS  # (both thresholds are attributes: tests lower them per shard)

    @property
    def n_tail(self) -> int:
        return self.tail.n

    @property
    def n(self) -> int:
        return self.n_base + self.n_tail

    def append(self, vecs: np.ndarray) -> None:
        self.tail.append(vecs)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Float32 vectors of the given rows."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        in_base = rows < self.n_base
        if in_base.any():
            assert self.base is not None
            base_rows = rows[in_base]
            out[in_base] = self.base.rows(base_rows) if hasattr(self.base, "rows") else self.base[base_rows]
        out[~in_base] = self.tail.rows(rows[~in_base] - self.n_base)
        return out

    def exact(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Float32 cosine of the given rows with the (normalized) query."""
        order = np.argsort(rows, kind="stable")  # sorted reads from the memory map
        out = np.empty(len(rows), dtype=np.float32)
        out[order] = self.take(np.asarray(rows)[order]) @ query
        return out

    def _matrix(self) -> np.ndarray:
        return self.base.array() if hasattr(self.base, "array") else self.base

    def mode(self) -> str:
        """'int8' when the base is scanned through its int8 codes, else 'float32'."""
        use = self.codes and self.n_base >= self.int8_min_rows and int8_kernel() is not None
        return "int8" if use else "float32"

    def scan(self, query: np.ndarray) -> tuple[np.ndarray, bool]:
        """Similarity of every row, and whether it is an int8 estimate (False: float32, exact)."""
        query = np.asarray(query, dtype=np.float32)
        parts: list[np.ndarray] = []
        approximate = False
        if self.n_base:
            assert self.base is not None
            if self.mode() == "int8":
                kernel = int8_kernel()
                assert kernel is not None
                q8, sq = query_codes(query)
                parts.append(kernel(self.codes["vec_i8"], q8) * (self.codes["vec_scale"] * np.float32(sq)))
                approximate = True
            else:
                parts.append(self._matrix() @ query)
        if self.n_tail:
            parts.append(self.tail.dot(query))
        if not parts:
            return np.zeros(0, dtype=np.float32), False
        return (np.concatenate(parts) if len(parts) > 1 else parts[0]), approximate

    def measure_recall(self, k: int = 10, queries: int = 8, seed: int = 0) -> float | None:
        """Top-k recall of the int8 scan with re-ranking against a float32 scan (vectors only)."""
        if self.base is None or self.n_base <= k or not self.codes or int8_kernel() is None:
            return None
        rng = np.random.default_rng(seed)
        found = 0
        for _ in range(queries):
            q = self.take(rng.integers(0, self.n_base, size=2)).sum(axis=0)
            q += rng.standard_normal(self.dim).astype(np.float32) * np.float32(np.linalg.norm(q) / 4)
            q /= np.linalg.norm(q)
            truth = np.argpartition(-(self._matrix() @ q), k)[:k]
            est, _ = self.scan(q)
            pool = np.argpartition(-est, k + RERANK)[: k + RERANK]
            best = pool[np.argpartition(-self.exact(pool, q), k)[:k]]
            found += len(np.intersect1d(truth, best))
        return found / (k * queries)

    def arrays(self, keep: np.ndarray) -> dict[str, np.ndarray]:
        """The rows `keep` as a fresh base block (float32 and int8 forms)."""
        vecs = self.take(keep)
        out = {"vec_f32": vecs, **quantize(vecs)}
        probe = Vectors(self.dim, out)
        probe.int8_min_rows = self.int8_min_rows
        recall = probe.measure_recall() if probe.mode() == "int8" else None
        out["int8_recall"] = np.array([np.nan if recall is None else recall])
        return out
