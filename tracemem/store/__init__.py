"""The DuckDB store: tables, batched writer, journal, loading, retention, snapshots."""
from .opening import StoreLockedError
from .retention import PruneReport
from .store import Store
from .tables import SCHEMA_VERSION

__all__ = ["Store", "StoreLockedError", "PruneReport", "SCHEMA_VERSION"]
