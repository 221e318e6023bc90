"""Which write produced one element of a list field: `backtrack(run, "notes[3]")` starts there.

A list is built by appends, item sets, deletes and whole sets, across the turns of a
thread and from a fork into the run it was forked from; element 3 is whatever those
operations, replayed in order, left at position 3. Replaying them needs only the runs
(`WalkedRuns`), never the trace being built, so it lives apart from the walker.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from ..record import Write
from ..scope.paths import parse_path
from .index import RunIndex
from .walked_runs import WalkedRuns

__all__ = ["element_write"]


def element_write(runs: WalkedRuns, idx: RunIndex, root: str, index: int,
                  upto: Optional[int] = None) -> Optional[tuple[RunIndex, Optional[Write]]]:
    """Which write produced element `index` of list field `root` (following appends, item sets and
    deletes in order, back through the thread, and from a fork into its original): (its run, the
    write, or None when the element came from a run's input); None when `root` is not a list or
    `index` is out of range. `upto`: as the list stood after that step of `idx`'s run."""
    fallback: Optional[tuple[RunIndex, Optional[Write]]] = None  # the fork whose input held it, if no further
    while True:  # into a fork's original, and its original's (a loop: a chain of forks has no depth limit)
        found = _producer(runs, idx, root, index, upto)
        if found is None:
            return fallback
        owner, produced, position = found
        forked = owner.run.forked_from_run_id if owner is not None and produced is None else None
        source = runs.index(forked) if forked else None
        if owner is None or source is None:
            return (owner, produced) if owner is not None else fallback
        fallback = (owner, None)  # in the fork's starting state: from the original
        idx, index, upto = source, position, owner.run.forked_from_step or 0


def _producer(runs: WalkedRuns, idx: RunIndex, root: str, index: int,
              upto: Optional[int]) -> Optional[tuple[Optional[RunIndex], Optional[Write], int]]:
    """Element `index` of list `root` in `idx`'s thread: (its run, the write or None for an input, its
    position in that input); None when `root` is not a list or `index` is out of range."""
    producers: list[tuple[str, Any, Optional[Write], int]] = []  # (run id, live run, write or None =
    # input, position in that input)
    for run_id, inputs, first, writes, live in runs.thread(idx, root):
        if upto is not None and run_id == idx.run.run_id:
            writes = [w for w in writes if w.step <= upto]
        if first or root in inputs:
            value = inputs.get(root)
            if not isinstance(value, list):
                return None
            producers = [(run_id, live, None, i) for i in range(len(value))]
        for w in writes:
            path = parse_path(w.path)
            if len(path) == 1:
                if w.verb == "append":
                    producers.append((run_id, live, w, -1))
                else:
                    value = json.loads(w.value) if w.value else []
                    producers = [(run_id, live, w, -1)] * (len(value) if isinstance(value, list) else 0)
            elif isinstance(path[1], int):
                if len(path) == 2 and w.verb == "delete":
                    del producers[path[1]]
                else:
                    producers[path[1]] = (run_id, live, w, -1)
    if not -len(producers) <= index < len(producers):
        return None
    run_id, live, produced, position = producers[index]
    return runs.index(run_id, live), produced, position
