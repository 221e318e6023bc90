"""`Source`: how the viewer gets at the store file without getting in an agent's way.

DuckDB lets one process write a file, and a process holding it open even read-only keeps a
writer out. A viewer that kept the store open would stop the agent it is watching from
starting, so the viewer never keeps the file itself open between requests:

- each request opens the store read-only through the CLI's path (`Store(path, read_only=True,
  snapshot_if_locked=True)`) and closes it when the page is rendered;
- when an agent holds the file, that path reads a snapshot copy; copying is the expensive part,
  so a copy is kept and reused until the file has changed and the copy is `refresh` seconds old;
- a memory action (`--allow-edit`) opens a writable Store just for that action and closes it at
  once; when an agent holds the file it fails with `StoreLockedError`, which the page reports.

Requests are served one at a time (a local viewer has one reader): no Store is shared between
threads, and there is never more than one connection of ours on the file.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from ..store import Store

__all__ = ["NO_EMBEDDERS", "Source", "file_version"]

# The viewer never embeds: opening without embedders also opens stores bound to any embedder (MiniLM...).
NO_EMBEDDERS = {"embedder": None, "snapshot_embedder": None}


def file_version(path: str) -> str:
    """The file's state as a token (size and mtime of the file and its WAL): it changes when an agent
    writes, so pollers can ask "anything new?" without opening DuckDB."""
    parts = []
    for name in (path, path + ".wal"):
        try:
            st = os.stat(name)
            parts.append(f"{st.st_size}.{st.st_mtime_ns}")
        except OSError:
            parts.append("-")
    return ":".join(parts)


class Source:
    """Opens the store for one request at a time (see the module docstring)."""

    def __init__(self, path: str, *, refresh: float = 3.0) -> None:
        self.path = path
        self.refresh = refresh
        self.lock = threading.Lock()
        self.note = ""  # why the data shown may be a copy (set while a snapshot is in use)
        self.served = ""  # file_version() of the data the last request read
        self._memo: dict[str, Any] = {}
        self._memo_version = ""
        self._snapshot: Optional[Store] = None
        self._snapshot_version = ""
        self._snapshot_at = 0.0

    def check(self) -> None:
        """Open the store once (and close it), so a wrong path or a file that is not a store fails at start."""
        with self.reading():
            pass

    @contextmanager
    def reading(self) -> Iterator[Store]:
        """A read-only Store for one request."""
        with self.lock:
            store, owned = self._open()
            try:
                yield store
            finally:
                if owned:
                    store.close()

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()`, remembered until the file changes (for facts like which tables exist, or the
        pipelines and subjects a filter offers); call it inside `reading()`."""
        if self._memo_version != self.served:
            self._memo, self._memo_version = {}, self.served
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _open(self) -> tuple[Store, bool]:
        version = file_version(self.path)
        if self._snapshot is not None:
            fresh = version == self._snapshot_version or time.monotonic() - self._snapshot_at < self.refresh
            if fresh:
                self.served = self._snapshot_version
                return self._snapshot, False
            self._drop_snapshot()
        store = Store(self.path, read_only=True, snapshot_if_locked=True, **NO_EMBEDDERS)
        if store.snapshot_of is None:
            self.note, self.served = "", version
            return store, True
        self._snapshot, self._snapshot_version, self._snapshot_at = store, version, time.monotonic()
        self.note, self.served = store.snapshot_note, version
        return store, False

    def _drop_snapshot(self) -> None:
        if self._snapshot is not None:
            self._snapshot.close()
        self._snapshot, self._snapshot_version, self.note = None, "", ""

    @contextmanager
    def writing(self) -> Iterator[Store]:
        """A writable Store for one action (StoreLockedError when an agent holds the file)."""
        with self.lock:
            self._drop_snapshot()  # the next read sees the change
            store = Store(self.path, **NO_EMBEDDERS)
            try:
                yield store
            finally:
                store.close()

    def close(self) -> None:
        with self.lock:
            self._drop_snapshot()
