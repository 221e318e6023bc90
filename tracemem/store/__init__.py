"""The DuckDB store: schema, batched writer, loading, retention."""
from .retention import PruneReport
from .schema import SCHEMA_VERSION
from .opening import StoreLockedError
from .store import Store

__all__ = ["Store", "StoreLockedError", "PruneReport", "SCHEMA_VERSION"]
