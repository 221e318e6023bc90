"""The scopes of the pipelines built in this process, by pipeline hash.

A run loaded from any store is rebuilt as its scope model (not a dict) when the
flow that produced it was built in this process; `Store.register_scope` adds a
scope by pipeline name for runs of flows not built here. This is the one answer
to "which scope does this recorded run use": an explicit object, `clear()`-able.
"""
from __future__ import annotations

import threading
from typing import Optional

from .schema import ScopeSchema

__all__ = ["KnownScopes", "known_scopes"]


class KnownScopes:
    """Pipeline hash (or, registered by hand, pipeline name) → the scope schema of its runs."""

    def __init__(self) -> None:
        self.by_hash: dict[str, ScopeSchema] = {}
        self.by_name: dict[str, ScopeSchema] = {}
        self._lock = threading.Lock()

    def add(self, pipeline_hash: str, schema: ScopeSchema) -> None:
        """Remember a built flow's scope."""
        with self._lock:
            self.by_hash[pipeline_hash] = schema

    def add_name(self, pipeline: str, schema: ScopeSchema) -> None:
        """Remember the scope of every run of a pipeline name (`Store.register_scope`)."""
        with self._lock:
            self.by_name[pipeline] = schema

    def find(self, pipeline_hash: str, pipeline: Optional[str] = None) -> Optional[ScopeSchema]:
        """The scope of a recorded run: by its flow's hash, else by pipeline name (None: unknown)."""
        return self.by_hash.get(pipeline_hash) or (self.by_name.get(pipeline) if pipeline else None)

    def clear(self) -> None:
        """Forget every scope (a test isolating itself from flows other tests built)."""
        with self._lock:
            self.by_hash.clear()
            self.by_name.clear()


known_scopes = KnownScopes()
