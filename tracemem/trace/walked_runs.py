"""The runs one backtrack walks through: each indexed once, other runs read from the store as the walk reaches them.

Why apart from the walker: the walker decides which nodes and edges a trace gets; where a
run's record comes from is another question. It is the run traced, a live run at hand (an
earlier turn of its thread, a subflow's child), or the store: a run read once per walk, a
thread read once and shared by every turn of it the walk reaches, and a thread's older turns
read a window at a time, so that a walk back through a long conversation makes one query per
window, not one per turn. A run the store no longer holds is remembered as absent, and `gone`
says why.
"""
from __future__ import annotations

from typing import Optional

from ..record import RunLoader, RunRecord, ThreadRun
from ..scope.paths import root_of
from .index import RunIndex

__all__ = ["WalkedRuns", "WINDOW"]

WINDOW = 64  # turns of a thread read from the store at a time


class WalkedRuns:
    """The run indexes of one walk, starting from the traced run's; the store (when at hand) for the others."""

    def __init__(self, first: RunIndex, store: Optional[RunLoader], cross_runs: bool) -> None:
        self.store = store
        self.cross_runs = cross_runs  # False: the walk stays in the runs at hand, the store is never read
        self.indexes: dict[str, RunIndex] = {first.run.run_id: first}
        self.threads: dict[str, tuple[list[ThreadRun], int]] = {}  # run id → (its thread, its position)
        self.by_root: dict[tuple[int, str], list[ThreadRun]] = {}  # (id of a thread, field) → its writes there
        self.loaded: dict[str, RunRecord] = {}  # runs read from the store, not yet indexed
        self.absent: set[str] = set()  # runs asked for and not in the store

    def index(self, run_id: str, live: Optional[RunRecord] = None) -> Optional[RunIndex]:
        """The index of a run: built from `live` when given, else read from the store; None when the walk
        cannot enter it (no store, cross_runs=False, or not in the store)."""
        if run_id not in self.indexes and live is not None:
            self.indexes[run_id] = RunIndex(live)
        if run_id not in self.indexes:
            if self.store is None or not self.cross_runs or run_id in self.absent:
                return None
            if run_id not in self.loaded:
                self._load(run_id)
            run = self.loaded.pop(run_id, None)
            if run is None:  # not in the store (pruned, or recorded elsewhere)
                self.absent.add(run_id)
                return None
            self.indexes[run_id] = RunIndex(run)
        return self.indexes[run_id]

    def _load(self, run_id: str) -> None:
        """Read a run from the store with, when it is a turn of a thread the walk knows, the older turns
        next to it that are not at hand yet (a walk back through a thread reaches them next)."""
        wanted = [run_id]
        known = self.threads.get(run_id)
        if known is not None:
            full, position = known
            wanted += [t.run_id for t in reversed(full[max(0, position - WINDOW + 1):position])
                       if t.run is None and t.run_id not in self.indexes and t.run_id not in self.loaded]
        assert self.store is not None
        self.loaded.update(self.store.runs_by_id(wanted))

    def gone(self, run_id: str) -> str:
        """What a trace says of a run it cannot enter."""
        when = self.store.pruned_at(run_id) if self.store is not None else None
        if when is not None:
            return f"pruned on {when:%Y-%m-%d %H:%M:%S} (prune(force=True) removed it as evidence)"
        return "run not in the store (recorded elsewhere, or pruned before tracemem kept tombstones)"

    def thread(self, idx: RunIndex, root: str) -> list[ThreadRun]:
        """The runs of the thread `idx` ends, oldest first, with their writes touching `root`. The thread
        is read once per walk (from live runs where at hand, the store for the rest) and shared by every
        run of it the walk reaches."""
        known = self.threads.get(idx.run.run_id)
        if known is None:
            full = idx.run.thread(load=self.cross_runs and self.store is not None)
            for i, t in enumerate(full):
                self.threads.setdefault(t.run_id, (full, i))
            known = self.threads[idx.run.run_id]
        full, position = known
        key = (id(full), root)
        filtered = self.by_root.get(key)
        if filtered is None:
            own = idx.own_writes(root)
            filtered = self.by_root[key] = [
                t._replace(writes=own if own is not None and t.run_id == idx.run.run_id
                           else [w for w in t.writes if root_of(w.path) == root]) for t in full]
        return filtered[:position + 1]

    def continued_gone(self, thread: list[ThreadRun]) -> Optional[str]:
        """The run a thread's oldest run here continues, when that run is not in the store."""
        if not thread or thread[0].first:
            return None
        owner = self.index(thread[0].run_id, thread[0].run)
        return owner.run.continues if owner is not None else None
