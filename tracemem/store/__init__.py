"""The store: one DuckDB file, or PostgreSQL for a fleet (store/backend.py is the seam, store/pg/ the PostgreSQL
side). `Store` (store.py) is the facade; behind it, three packages: write/ (the listener, journal and writer a
run's records go through), read/ (loading runs, listing, threads, snapshots, user SQL) and audit/ (sources,
affected and suspect runs, feedback, blame, retention)."""
from .audit.retention import PruneReport
from .opening import StoreLockedError
from .store import Store
from .tables import SCHEMA_VERSION

__all__ = ["Store", "StoreLockedError", "PruneReport", "SCHEMA_VERSION"]
