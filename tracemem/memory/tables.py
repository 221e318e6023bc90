"""DDL of the memory tables. The store runs `MEMORY_DDL` when it creates a file.

Column names are part of the public surface: users write SQL against them.
Embeddings are FLOAT[] (any dimension); the dimension and embedder id in use
are recorded in `tracemem_meta` under `memory.dim` and `memory.embedder_id`.
"""

from __future__ import annotations

__all__ = ["MEMORY_DDL", "MEMORY_COLUMNS", "META_EMBEDDER_ID", "META_DIM"]

META_EMBEDDER_ID = "memory.embedder_id"
META_DIM = "memory.dim"


MEMORY_DDL: list[str] = [
    """CREATE TABLE IF NOT EXISTS memories (
        memory_id     VARCHAR PRIMARY KEY,
        subject       VARCHAR NOT NULL,
        text          VARCHAR NOT NULL,
        tags          VARCHAR[] NOT NULL DEFAULT [],
        confidence    DOUBLE NOT NULL CHECK (confidence >= 0 AND confidence <= 100),
        review_state  VARCHAR NOT NULL CHECK (review_state IN ('fresh', 'reviewed', 'stale', 'contradicted')),
        valid_from    TIMESTAMP,
        valid_until   TIMESTAMP,
        source_run_id VARCHAR,
        source_step   INTEGER,
        source_ref    VARCHAR,
        embedder_id   VARCHAR,
        embedding     FLOAT[],
        created_at    TIMESTAMP NOT NULL,
        updated_at    TIMESTAMP NOT NULL,
        deleted_at    TIMESTAMP,
        superseded_by VARCHAR
    )""",
    "CREATE SEQUENCE IF NOT EXISTS memory_event_seq START 1",
    """CREATE TABLE IF NOT EXISTS memory_events (
        event_id  BIGINT PRIMARY KEY DEFAULT nextval('memory_event_seq'),
        memory_id VARCHAR NOT NULL,
        event     VARCHAR NOT NULL,
        old       VARCHAR,
        new       VARCHAR,
        run_id    VARCHAR,
        "at"      TIMESTAMP NOT NULL,  -- quoted: AT is a keyword in DuckDB 2
        reason    VARCHAR
    )""",
    "CREATE INDEX IF NOT EXISTS memory_events_memory_idx ON memory_events (memory_id)",
]

# Column order used by every SELECT of a full record (embedding excluded).
MEMORY_COLUMNS: tuple[str, ...] = (
    "memory_id", "subject", "text", "tags", "confidence", "review_state", "valid_from", "valid_until",
    "source_run_id", "source_step", "source_ref", "embedder_id", "created_at", "updated_at",
    "deleted_at", "superseded_by",
)
