"""Rebuilding scope data from the write log: how a run's state at any step is known.

A live run and one loaded from the store replay the same way: start from the
thread's first recorded input, and for each run of the thread (oldest first)
merge its recorded input, then apply its writes in order. Writes of failed steps
were never committed, so the loaders leave them out.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Optional

from ..record import ThreadRun, Write
from .paths import apply_write, parse_path

__all__ = ["apply_writes", "replay_thread"]


def apply_writes(data: dict[str, Any], writes: Iterable[Write], reset: Callable[[str], Any],
                 upto: Optional[int] = None) -> dict[str, Any]:
    """Apply recorded writes to `data` in place (only those of steps ≤ `upto`, when given)."""
    for w in writes:
        if upto is not None and w.step > upto:
            break
        apply_write(data, parse_path(w.path), w.verb, None if w.value is None else json.loads(w.value), reset)
    return data


def replay_thread(thread: list[ThreadRun], reset: Callable[[str], Any], upto: Optional[int] = None,
                  start: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The scope data at the end of a thread (the last run's writes only up to step `upto`).
    `start` is the state before the thread's first run here, when earlier runs were replayed already."""
    data: dict[str, Any] = dict(start or {})
    last = len(thread) - 1
    for i, run in enumerate(thread):
        data = {**data, **run.inputs}
        apply_writes(data, run.writes, reset, upto if i == last else None)
    return data
