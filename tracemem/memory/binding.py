"""Which embedder a store is bound to, and the checks that keep vector spaces apart.

A store's vectors are only comparable if one embedder produced them all. The
first embedded write records `memory.embedder_id` and `memory.dim` in
`tracemem_meta`; opening the store with another embedder fails loudly, and
`reembed` is the one sanctioned way to switch.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import duckdb
import numpy as np

from . import sql
from .embedders import Embedder, check_vectors
from .errors import EmbedderMismatchError, MemoryInputError
from .tables import META_DIM, META_EMBEDDER_ID

__all__ = ["bound_id", "check_store_embedder", "bind", "embed", "embed_blocks", "given_vector", "reembed_all"]


def bound_id(con: duckdb.DuckDBPyConnection) -> str | None:
    """The embedder id the store's vectors came from (tracemem_meta, else a stored vector's), None if none."""
    stored = sql.get_meta(con, META_EMBEDDER_ID)
    if stored:
        return stored
    row = con.execute("SELECT embedder_id FROM memories WHERE embedding IS NOT NULL LIMIT 1").fetchone()
    return row[0] if row else None


def check_store_embedder(con: duckdb.DuckDBPyConnection, emb: Embedder | None) -> None:
    """Refuse an embedder whose id or dim differs from the one the store's vectors came from."""
    if emb is None:
        return
    if not isinstance(getattr(emb, "dim", None), int) or emb.dim <= 0 or not getattr(emb, "embedder_id", None):
        raise MemoryInputError(f"embedder {emb!r} must have a non-empty embedder_id and a positive int dim")
    stored_id = sql.get_meta(con, META_EMBEDDER_ID)
    stored_dim = sql.get_meta(con, META_DIM)
    others = [r[0] for r in con.execute(
        "SELECT DISTINCT embedder_id FROM memories WHERE embedding IS NOT NULL AND embedder_id <> ? LIMIT 3",
        [emb.embedder_id]).fetchall()]
    if (stored_id and stored_id != emb.embedder_id) or others:
        raise EmbedderMismatchError(
            f"this store's memories were embedded with {stored_id or others[0]!r}, but the configured embedder "
            f"is {emb.embedder_id!r}: vectors of two embedders are not comparable. Open the store with the same "
            f"embedder, or switch explicitly: Memory(con, lock, embedder=None).reembed(new_embedder)")
    if stored_dim and int(stored_dim) != emb.dim:
        raise EmbedderMismatchError(f"store vectors have dim {stored_dim}, the embedder has dim {emb.dim}")


def bind(con: duckdb.DuckDBPyConnection, emb: Embedder | None, *, force: bool = False) -> None:
    """Record the embedder in tracemem_meta (first embedded write, or an explicit switch)."""
    if emb is not None and (force or sql.get_meta(con, META_EMBEDDER_ID) is None):
        sql.set_meta(con, META_EMBEDDER_ID, emb.embedder_id)
        sql.set_meta(con, META_DIM, str(emb.dim))


def embed(emb: Embedder | None, texts: Sequence[str]) -> np.ndarray | None:
    """Embed and validate (shape, NaN) — an embedder's output is checked like user input."""
    if emb is None or not texts:
        return None
    return check_vectors(emb.embed(list(texts)), dim=emb.dim, n=len(texts),
                         what=f"output of embedder {emb.embedder_id!r}")


def embed_blocks(emb: Any, texts: Sequence[str], size: int) -> Iterator[np.ndarray]:
    """`embed`, in blocks of `size` texts made one at a time (an embedder with `embed_chunks`, as the
    hashing one has: the same vectors as one call); each block is checked like `embed`'s output."""
    texts = list(texts)
    for start, block in zip(range(0, len(texts), size), emb.embed_chunks(texts, size)):
        yield check_vectors(block, dim=emb.dim, n=len(texts[start : start + size]),
                            what=f"output of embedder {emb.embedder_id!r}")


def given_vector(emb: Embedder | None, embedding: Any, embedder_id: str | None) -> np.ndarray:
    """A caller-supplied vector must name the store's embedder and have its dimension."""
    if emb is None:
        raise EmbedderMismatchError("an embedding was given but this memory has no embedder configured")
    if embedder_id is None or embedder_id != emb.embedder_id:
        raise EmbedderMismatchError(
            f"embedding comes from embedder {embedder_id!r} but this store uses {emb.embedder_id!r}; "
            f"pass embedder_id={emb.embedder_id!r} with a vector of that model")
    return check_vectors(embedding, dim=emb.dim, n=1)


def reembed_all(con: duckdb.DuckDBPyConnection, emb: Embedder, batch: int = 512, ops: Any = sql) -> int:
    """Replace every stored vector (forgotten records too) with `emb`'s, and rebind the store
    (`ops`: the store's memory SQL, memory/sql.py by default)."""
    rows = con.execute("SELECT memory_id, text FROM memories ORDER BY memory_id").fetchall()
    with ops.transaction(con):
        for start in range(0, len(rows), batch):
            chunk = rows[start:start + batch]
            vecs = embed(emb, [t for _, t in chunk])
            assert vecs is not None
            ops.write_embeddings(con, [m for m, _ in chunk], vecs, emb.embedder_id)
        bind(con, emb, force=True)
    return len(rows)
