"""`Source`: how the viewer gets at the store without getting in an agent's way, or one page in another's.

DuckDB lets one process write a file, and a process holding it open even read-only keeps a
writer out. A viewer that kept the store open would stop the agent it is watching from
starting, so the viewer never keeps the file itself open between requests:

- each request opens the store read-only through the CLI's path (`Store(path, read_only=True,
  snapshot_if_locked=True)`) and closes it when the page is rendered;
- when an agent holds the file, that path reads a snapshot copy; copying is the expensive part,
  so a copy is kept and shared by the requests that come until the file has changed and the copy
  is `refresh` seconds old; it is closed (and its folder removed) when the last request using it
  is done, and when the viewer stops;
- a memory action (`--allow-edit`) opens a writable Store just for that action and closes it at
  once; when an agent holds the file it fails with `StoreLockedError`, which the page reports.

Pages are served side by side (Starlette runs each in a worker thread), so one slow page never
holds up the others: a request's own Store is its own, and on a shared snapshot copy the pages
take turns on its connection (each within its time limit) while SQL typed in the console runs
in the fenced instance beside it (store/read/user_sql.py), which serves each thread on a cursor of its
own. Every query a page runs has a time limit (ui/limits.py).
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from ..store import Store
from ..store.backend import is_postgres_url
from .limits import interrupt, time_limit

__all__ = ["NO_EMBEDDERS", "Source", "file_version", "label_of"]

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


def label_of(path: str) -> str:
    """The store as pages name it: a PostgreSQL URL without its password (or any other secret), a file as given."""
    if is_postgres_url(path):
        from ..store.pg.connection import parse_target

        return parse_target(path).label
    return path


@dataclass
class Shared:
    """A snapshot copy's Store, shared by the requests that read it."""

    store: Store
    version: str
    at: float
    users: int = 0
    retired: bool = False
    turn: threading.Lock = field(default_factory=threading.Lock)  # pages take turns on its connection


class Source:
    """Opens the store for each request (see the module docstring); `timeout`: seconds any query may run."""

    def __init__(self, path: str, *, refresh: float = 3.0, timeout: float = 10.0) -> None:
        self.path = path
        self.label = label_of(path)
        self.refresh = refresh
        self.timeout = timeout
        self.lock = threading.Lock()  # guards the bookkeeping below, never held while a page runs
        self.note = ""  # why the data shown may be a copy (set while a snapshot is in use)
        self.served = ""  # file_version() of the data the last request read
        self._memo: dict[str, Any] = {}
        self._memo_version = ""
        self._shared: Optional[Shared] = None
        self._active: list[Store] = []  # the stores requests are reading now, once per request (stopped by `close`)

    def check(self) -> None:
        """Open the store once (and close it), so a wrong path or a file that is not a store fails at start."""
        with self.reading():
            pass

    @contextmanager
    def reading(self, *, user_sql: bool = False) -> Iterator[Store]:
        """A read-only Store for one request, whose queries stop after `timeout`. `user_sql`: the request runs
        only SQL typed by a person, fenced with its own time limit (store/read/user_sql.py), so it neither takes a
        turn on a shared copy's connection nor sets a limit on it (which would stop the page whose turn it is)."""
        store, shared = self._acquire()
        with self.lock:
            self._active.append(store)
        try:
            turn = shared.turn if shared is not None and not user_sql else nullcontext()
            limit = nullcontext() if user_sql else time_limit(store, self.timeout)
            with turn, limit:
                yield store
        finally:
            self._release(store, shared)

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()`, remembered until the file changes (for facts like which tables exist, or the
        pipelines and subjects a filter offers); call it inside `reading()`."""
        with self.lock:
            if self._memo_version != self.served:
                self._memo, self._memo_version = {}, self.served
            if key in self._memo:
                return self._memo[key]
        value = compute()
        with self.lock:
            self._memo[key] = value
        return value

    def _acquire(self) -> tuple[Store, Optional[Shared]]:
        with self.lock:
            version = file_version(self.path)
            shared = self._shared
            if shared is not None:
                if version == shared.version or time.monotonic() - shared.at < self.refresh:
                    shared.users += 1
                    self.served = shared.version
                    return shared.store, shared
                self._retire()
            store = Store(self.path, read_only=True, snapshot_if_locked=True, **NO_EMBEDDERS)
            if store.snapshot_of is None:
                self.note, self.served = "", version
                return store, None
            shared = self._shared = Shared(store, version, time.monotonic(), users=1)
            self.note, self.served = store.snapshot_note, version
            return store, shared

    def _release(self, store: Store, shared: Optional[Shared]) -> None:
        with self.lock:
            self._active.remove(store)
        if shared is None:
            store.close()
            return
        with self.lock:
            shared.users -= 1
            done = shared.retired and shared.users == 0
        if done:
            shared.store.close()

    def _retire(self) -> None:
        """Stop handing out the current copy; it closes when its last request is done (call under the lock)."""
        shared, self._shared, self.note = self._shared, None, ""
        if shared is not None:
            shared.retired = True
            if shared.users == 0:
                shared.store.close()

    @contextmanager
    def writing(self) -> Iterator[Store]:
        """A writable Store for one action (StoreLockedError when an agent holds the file)."""
        with self.lock:
            self._retire()  # the next read sees the change
        store = Store(self.path, **NO_EMBEDDERS)
        try:
            yield store
        finally:
            store.close()

    def close(self) -> None:
        """Stop what requests still run (the server is stopping) and close the snapshot copy."""
        with self.lock:
            for store in set(self._active):
                interrupt(store)
            self._retire()
