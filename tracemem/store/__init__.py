"""The DuckDB store: schema, batched writer, loading, retention."""
from .retention import PruneReport
from .schema import SCHEMA_VERSION
from .store import Store, StoreLockedError

__all__ = ["Store", "StoreLockedError", "PruneReport", "SCHEMA_VERSION"]
