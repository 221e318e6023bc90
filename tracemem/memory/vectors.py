"""One shard's vectors, and the similarity scan over them.

Rows loaded from a shard file (the base) are memory-mapped float32, plus an
int8 copy (one scale per row); rows added since live in a growing float32
array. Why int8: at a million rows a float32 scan reads 1.5 GB per query, the
int8 scan 0.4 GB, and only the int8 copy has to stay resident.

Below `INT8_MIN_ROWS` (and whenever the optional `numkong` kernel is missing)
the scan is float32 with numpy's BLAS: exact. Above it the scan is int8, and
each estimate comes with a bound that Cauchy-Schwarz guarantees, from the
stored distance between a row's int8 and float32 forms (`err`, `cn`):

    |q.v - s_v s_q (c_v . c_q)| <= |q| err_v + cn_v |q - s_q c_q| (+ float slack)

Search uses the bound to find every row that could reach the top k and
recomputes those in float32 (`exact`), so the records returned, their order
and their scores are what a float32 scan gives. What is not recomputed is
candidacy near the similarity threshold (a record with no query word whose
cosine is within the bound of `min_similarity`): there the count of matching
records can differ from a float32 scan, and the search result says the scan
was int8 (`SearchResult.scan`). Recomputing those rows too would touch tens of
thousands of float32 rows per query at a million records.

The int8 kernel comes from the optional `numkong` package
(`pip install 'tracemem-agents[scale]'`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["Vectors", "quantize", "int8_kernel", "INT8_MIN_ROWS"]

INT8_MIN_ROWS = 250_000  # below this the float32 matrix is small and its scan fast: stay exact
_SLACK = 1e-5  # float32 rounding of the estimate and of the exact value, with room to spare


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


def quantize(vecs: np.ndarray, chunk: int = 65_536) -> dict[str, np.ndarray]:
    """Per-row symmetric int8 codes with their scale, error norm and code norm (chunked: no big temporaries)."""
    n = len(vecs)
    out = {"vec_i8": np.zeros((n, vecs.shape[1]), dtype=np.int8), "vec_scale": np.ones(n, dtype=np.float32),
           "vec_err": np.zeros(n, dtype=np.float32), "vec_cn": np.zeros(n, dtype=np.float32)}
    for lo in range(0, n, chunk):
        v = np.asarray(vecs[lo : lo + chunk], dtype=np.float32)
        peak = np.abs(v).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        codes = np.clip(np.rint(v / scale[:, None]), -127, 127).astype(np.int8)
        approx = codes.astype(np.float32) * scale[:, None]
        out["vec_i8"][lo : lo + chunk] = codes
        out["vec_scale"][lo : lo + chunk] = scale
        out["vec_err"][lo : lo + chunk] = np.linalg.norm(v - approx, axis=1)
        out["vec_cn"][lo : lo + chunk] = np.linalg.norm(approx, axis=1)
    return out


class Vectors:
    """Base rows (memory-mapped float32, optional int8 codes) followed by rows added in this process."""

    def __init__(self, dim: int, base: Mapping[str, Any] | None = None) -> None:
        self.dim = dim
        base = base or {}
        self.base: np.ndarray | None = base.get("vec_f32")
        self.n_base = 0 if self.base is None else len(self.base)
        self.codes = {k: base[k] for k in ("vec_i8", "vec_scale", "vec_err", "vec_cn") if k in base}
        self.tail = np.zeros((16, dim), dtype=np.float32)
        self.n_tail = 0
        self.int8_min_rows = INT8_MIN_ROWS

    @property
    def n(self) -> int:
        return self.n_base + self.n_tail

    def append(self, vecs: np.ndarray) -> None:
        need = self.n_tail + len(vecs)
        if need > len(self.tail):
            new = np.zeros((max(need, 2 * len(self.tail)), self.dim), dtype=np.float32)
            new[: self.n_tail] = self.tail[: self.n_tail]
            self.tail = new
        self.tail[self.n_tail : need] = vecs
        self.n_tail = need

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Float32 vectors of the given rows."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        in_base = rows < self.n_base
        if in_base.any():
            assert self.base is not None
            out[in_base] = self.base[rows[in_base]]
        out[~in_base] = self.tail[rows[~in_base] - self.n_base]
        return out

    def exact(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Float32 cosine of the given rows with the (normalized) query."""
        order = np.argsort(rows, kind="stable")  # sorted reads from the memory map
        out = np.empty(len(rows), dtype=np.float32)
        out[order] = self.take(np.asarray(rows)[order]) @ query
        return out

    def mode(self) -> str:
        """'int8' when the base is scanned through its int8 codes, else 'float32'."""
        use = self.codes and self.n_base >= self.int8_min_rows and int8_kernel() is not None
        return "int8" if use else "float32"

    def scan(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Similarity of every row, and a per-row error bound (None: every value is exact)."""
        query = np.asarray(query, dtype=np.float32)
        parts: list[np.ndarray] = []
        bound: np.ndarray | None = None
        if self.n_base:
            assert self.base is not None
            if self.mode() == "int8":
                kernel = int8_kernel()
                assert kernel is not None
                peak = float(np.abs(query).max())
                sq = peak / 127.0 if peak > 0 else 1.0
                q8 = np.clip(np.rint(query / sq), -127, 127).astype(np.int8)
                q_err = float(np.linalg.norm(query - q8.astype(np.float32) * sq))
                c = self.codes
                parts.append(kernel(c["vec_i8"], q8) * (c["vec_scale"] * np.float32(sq)))
                bound = np.zeros(self.n, dtype=np.float32)
                bound[: self.n_base] = (c["vec_err"] * np.float32(np.linalg.norm(query))
                                        + c["vec_cn"] * np.float32(q_err) + np.float32(_SLACK))
            else:
                parts.append(self.base @ query)
        if self.n_tail:
            parts.append(self.tail[: self.n_tail] @ query)
        if not parts:
            return np.zeros(0, dtype=np.float32), None
        return (np.concatenate(parts) if len(parts) > 1 else parts[0]), bound

    def arrays(self, keep: np.ndarray) -> dict[str, np.ndarray]:
        """The rows `keep` as a fresh base block (float32 and int8 forms)."""
        vecs = self.take(keep)
        return {"vec_f32": vecs, **quantize(vecs)}
