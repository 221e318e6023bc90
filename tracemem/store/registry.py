"""The stores open for writing in this process: at most one per file.

Two `Store` objects writing one file in one process would each keep their own queue,
memory index and snapshot index, so a memory forgotten and purged through one would
still be recalled through the other. A second writing open of a file this process
already has open is therefore refused, naming where the first was opened: share
that Store between threads instead (it is thread-safe), or close it first.

`open_stores` is the one registry tracemem keeps in a process, and why it must exist:
DuckDB shares one database between the connections a process opens to a file, so the
only place that can see a second writer of the same file is the process itself. Its
entries belong to the process that made them: a forked child sees none of its
parent's. The `tracemem` command flushes what it lists when stopped by SIGTERM
(cli/signals.py); an application does so in its own shutdown hook (`store.close()`).
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Optional

from .opening import StoreLockedError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def caller() -> str:
    """`file:line` of the first frame outside tracemem (where a Store was opened)."""
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"


class OpenStores:
    """Files open for writing in this process → the Store (weakly held) and where it was opened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Optional["weakref.ref[Any]"], str]] = {}
        self._pid = os.getpid()

    @staticmethod
    def key(path: str) -> str:
        return os.path.realpath(path)

    def claim(self, path: str, where: str) -> str:
        """Reserve `path` for a Store being opened; StoreLockedError if one is open already."""
        key = self.key(path)
        with self._lock:
            self._own()
            entry = self._entries.get(key)
            if entry is not None:
                ref, first = entry
                holder = ref() if ref is not None else None
                if ref is None or (holder is not None and not getattr(holder, "closed", False)):
                    raise StoreLockedError(
                        f"{path} is already open for writing in this process (Store opened at {first}); use "
                        f"that Store object (it is safe to share between threads) or close() it first. Two "
                        f"writers on one file would keep separate queues and memory indexes, so a memory "
                        f"forgotten through one could still be recalled through the other")
            self._entries[key] = (None, where)
        return key

    def attach(self, key: str, store: Any) -> None:
        """The Store reserved under `key` is open."""
        with self._lock:
            where = self._entries[key][1]
            self._entries[key] = (weakref.ref(store), where)

    def release(self, key: str, store: Any = None) -> None:
        """Forget `key` (only if it still names `store`, when given)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (store is None or entry[0] is None or entry[0]() in (store, None)):
                del self._entries[key]

    def _own(self) -> None:
        """Forget the entries of the process this one was forked from (under the lock)."""
        if self._pid != os.getpid():
            self._entries.clear()
            self._pid = os.getpid()

    def stores(self) -> list[Any]:
        """The Store objects open for writing now."""
        with self._lock:
            self._own()
            found = [ref() for ref, _ in self._entries.values() if ref is not None]
        return [s for s in found if s is not None and not getattr(s, "closed", False)]

    def flush_all(self) -> None:
        """Flush every open store (the CLI on SIGTERM); a failure is printed, never raised (no caller is left)."""
        for store in self.stores():
            try:
                store.flush()
            except Exception as err:  # noqa: BLE001 - report and go on with the others
                print(f"tracemem: {err}", file=sys.stderr)



open_stores = OpenStores()
