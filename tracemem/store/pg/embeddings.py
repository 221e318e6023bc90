"""How a memory's embedding travels to and from PostgreSQL: pgvector's `vector`, or a plain `real[]`.

A store keeps embeddings in whichever of the two its database offered when it was created
(schema.py's `embedding_type`). Both are written from a `real[]` parameter, cast to `vector`
where that is the column's type, and both are read in their binary form (`vector_send`,
`array_send`) and decoded with numpy: a million vectors load without a Python float each.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["EmbeddingColumn"]


class EmbeddingColumn:
    """The `memories.embedding` column of one store: `kind` 'vector' (pgvector) or 'array' (real[])."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.send = "vector_send" if kind == "vector" else "array_send"  # the SQL function that reads it as bytes
        self.cast = "::vector" if kind == "vector" else ""  # after `?::real[]`: what a written value becomes

    def decode(self, raw: Optional[bytes]) -> Optional[np.ndarray]:
        """A stored embedding from its binary form (pgvector's, or a real[] array's)."""
        if raw is None:
            return None
        if self.kind == "vector":
            return np.frombuffer(raw, dtype=">f4", offset=4).astype(np.float32)
        ndim = int.from_bytes(raw[:4], "big")
        if ndim == 0:
            return np.zeros(0, dtype=np.float32)
        pairs = np.frombuffer(raw, dtype=">i4", offset=12 + 8 * ndim).reshape(-1, 2)
        return pairs[:, 1].copy().view(">f4").astype(np.float32)
