"""Rebuilding scope data from the write log: how a run's state at any step is known.

A live run and one loaded from the store replay the same way: start from the
thread's first recorded input, and for each run of the thread (oldest first)
merge its recorded input, then apply its writes in order. Writes of failed steps
were never committed, so the loaders leave them out.

A long thread is replayed without redoing every turn: a field's value depends only
on the last event that replaced it whole (a run input naming it, a `set` or `delete`
of the field itself) and what came after, so earlier writes to it are skipped, and
a run of appends to a list is decoded as one JSON array.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from ..fastjson import loads
from ..record import ThreadRun, Write
from .paths import apply_write, parse_path, root_of

__all__ = ["apply_writes", "replay_thread"]


def apply_writes(data: dict[str, Any], writes: Iterable[Write], reset: Callable[[str], Any],
                 upto: Optional[int] = None) -> dict[str, Any]:
    """Apply recorded writes to `data` in place (only those of steps ≤ `upto`, when given)."""
    for w in writes:
        if upto is not None and w.step > upto:
            break
        apply_write(data, parse_path(w.path), w.verb, None if w.value is None else loads(w.value), reset)
    return data


def _whole(w: Write, root: str) -> bool:
    """Whether a write replaces its field whole (so nothing written to the field before it matters)."""
    return w.path == root and w.verb != "append"


def _apply_root(data: dict[str, Any], root: str, writes: list[Write], reset: Callable[[str], Any]) -> None:
    """Apply one field's writes in order, decoding each run of top-level appends to a list at once."""
    i, n = 0, len(writes)
    while i < n:
        w = writes[i]
        if w.verb == "append" and w.path == root and isinstance(data.get(root), list):
            j = i
            while j < n and writes[j].verb == "append" and writes[j].path == root:
                j += 1
            data[root].extend(loads("[" + ",".join("null" if x.value is None else x.value
                                                         for x in writes[i:j]) + "]"))
            i = j
            continue
        apply_write(data, parse_path(w.path), w.verb, None if w.value is None else loads(w.value), reset)
        i += 1


def replay_thread(thread: list[ThreadRun], reset: Callable[[str], Any], upto: Optional[int] = None,
                  start: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The scope data at the end of a thread (the last run's writes only up to step `upto`).
    `start` is the state before the thread's first run here, when earlier runs were replayed already."""
    last = len(thread) - 1
    runs: list[tuple[dict[str, Any], list[Write]]] = []
    for i, run in enumerate(thread):
        writes = run.writes if i != last or upto is None else [w for w in _until(run.writes, upto)]
        runs.append((run.inputs, writes))
    # where each field was last replaced whole: (run position, write position; -1 = the run's input);
    # `order` is the order a write-by-write replay gives the fields (the data of a scope-less run shows it)
    cut: dict[str, tuple[int, int]] = {}
    order: dict[str, None] = dict.fromkeys(start or {})
    for i, (inputs, writes) in enumerate(runs):
        for name in inputs:
            cut[name] = (i, -1)
            order[name] = None
        for j, w in enumerate(writes):
            root = root_of(w.path)
            if _whole(w, root):
                cut[root] = (i, j)
                order[root] = None
    data: dict[str, Any] = dict(start or {})
    pending: dict[str, list[Write]] = {}
    for i, (inputs, writes) in enumerate(runs):
        for name, value in inputs.items():
            if cut[name] == (i, -1):
                data[name] = value
        for j, w in enumerate(writes):
            root = root_of(w.path)
            if cut.get(root, (-1, -1)) <= (i, j):
                pending.setdefault(root, []).append(w)
    for root, writes in pending.items():
        _apply_root(data, root, writes, reset)
    return {name: data[name] for name in order if name in data} if list(data) != list(order) else data


def _until(writes: list[Write], upto: int) -> Iterable[Write]:
    for w in writes:
        if w.step > upto:
            break
        yield w
