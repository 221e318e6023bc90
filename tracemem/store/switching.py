"""While a store's writer writes a batch, the interpreter switches threads every 0.5 ms, not 5.

Why: the background writer needs the GIL ~25 times a batch, each time briefly (its own
Python work, and DuckDB checking for signals between the tasks of a statement). A flow's
thread never blocks (its journal append is a memory copy), so it gives the GIL up only
when the interpreter asks it to, once a waiting thread has waited one switch interval:
5 ms by default, 25 times a batch, and the queue filled until flow.run waited for room.
Producers handing the GIL over themselves (a zero sleep once per run while the writer
was busy) cost them ~70 µs each here: a timed sleep, then a timed wait to get the GIL
back, each ~20 µs of CPU on this virtual machine. With a short interval while a batch is
written, the interpreter hands the GIL over at a bytecode boundary, untimed, only when the
writer asks: ~1 µs per stage less (bench/peers.py --section durability).

The interval is process-wide: the first writer to start a batch saves it and the last to
finish puts it back, so what the application set is restored; an application interval
shorter than 0.5 ms is left as it is. A child forked meanwhile (it has no writer thread)
gets the saved interval back at once.
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["WRITING_SWITCH_INTERVAL", "quick_switching"]

WRITING_SWITCH_INTERVAL = 0.0005  # seconds (sys.setswitchinterval) while a store's writer writes a batch

_lock = threading.Lock()
_writing = 0  # writers inside `quick_switching` now
_saved: float | None = None  # the interval before the first of them entered, if they changed it


@contextmanager
def quick_switching() -> Iterator[None]:
    """The interpreter's switch interval at most `WRITING_SWITCH_INTERVAL` for the duration."""
    global _writing, _saved
    with _lock:
        if _writing == 0:
            now = sys.getswitchinterval()
            _saved = now if now > WRITING_SWITCH_INTERVAL else None  # (set again, a value can lose a µs)
            if _saved is not None:
                sys.setswitchinterval(WRITING_SWITCH_INTERVAL)
        _writing += 1
    try:
        yield
    finally:
        with _lock:
            _writing -= 1
            if _writing == 0 and _saved is not None:
                sys.setswitchinterval(_saved)


def _forked() -> None:
    """In a child forked while a batch was being written: no writer runs here, so put the interval back."""
    global _writing, _saved
    if _writing and _saved is not None:
        sys.setswitchinterval(_saved)
    _writing, _saved = 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
