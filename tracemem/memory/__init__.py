"""tracemem.memory: long-term memory records, honest recall, embedders and the vector index.

Never imports the runner, the store, the CLI or `stages`: the store creates
`Memory(store.con, store.lock, embedder=...)` after running `MEMORY_DDL`.
"""

from .api import DEFAULT_FLOOR, Memory
from .embedders import HASHING_CAVEAT, Embedder, HashingEmbedder
from .errors import (EmbedderMismatchError, EmbedderUnavailableError, MemoryInputError, MemoryNotFoundError,
                     MemoryStoreError)
from .minilm import MiniLMEmbedder
from .records import FLAGGED_STATES, REVIEW_STATES, MemoryEvent, MemoryRecord
from .search import Exclusion, ScoredRecord, SearchResult
from .tables import MEMORY_DDL

__all__ = [
    "Memory", "DEFAULT_FLOOR", "MemoryRecord", "MemoryEvent", "ScoredRecord", "SearchResult", "Exclusion",
    "Embedder", "HashingEmbedder", "MiniLMEmbedder", "HASHING_CAVEAT", "MEMORY_DDL", "REVIEW_STATES",
    "FLAGGED_STATES", "MemoryStoreError", "MemoryInputError", "MemoryNotFoundError", "EmbedderMismatchError",
    "EmbedderUnavailableError",
]
