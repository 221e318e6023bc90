"""The store: tables, batched writer, journal, loading, retention, snapshots — in a DuckDB file, or in
PostgreSQL for a fleet (store/backend.py is the seam between them, store/pg/ the PostgreSQL side)."""
from .opening import StoreLockedError
from .retention import PruneReport
from .store import Store
from .tables import SCHEMA_VERSION

__all__ = ["Store", "StoreLockedError", "PruneReport", "SCHEMA_VERSION"]
