"""The store's write side as one listener: a run's events in, journal entries and queued pieces out.

`flow.run(..., store=store)` adds `store.listener(durability)` to the run's listeners. It hears
the run's typed events (flow/events.py) and, per durability mode, makes the run survive a
crash before the call that produced it returns, then queues it for the writer:

| durability | as a step begins | as a step finishes | as the run ends |
|---|---|---|---|
| `"run"` (default) | — | — | the whole run journaled, then queued |
| `"stage"` | (`fsync=True`: the stage before it synced) | the stage journaled, then queued | its end journaled, then queued |

A resumed run's runs row and earlier record are in the tables already: its end carries
what it added since. Each journal append and the queueing of its piece happen under the
journal's lock, so the writer meets pieces in journal order and the position it commits
with a batch covers exactly what the batch holds. The listener also keeps the final
state of the runs it recorded last (`recent`), so `resume=<run id>` need not replay them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional

from ...errors import StoreError, TracememError
from ...flow.events import RunFailedEvent, RunFinished, RunPaused, RunStarted, StepFinished, StepStarted
from ...run import Run
from .journal import Entry, begin_entry, end_entry, run_entry, step_entry
from .rows import Piece, Records, RunFacts, end_facts, plain_records, run_records, run_row
from .writer import Writer

__all__ = ["StoreListener", "Recent", "cost_of"]

ENDS = (RunFinished, RunPaused, RunFailedEvent)
NOTHING: tuple = ((), (), (), (), ())  # a piece with no records


class Recent:
    """The final states of the runs a store recorded last (at most `size`), by run id: what `resume=<run id>`
    continues without replaying its thread. Each is (pipeline, thread id, scope schema, {field: value}): the
    run's final values, not the run (a thread's earlier runs are not kept alive by it)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._states: "OrderedDict[str, tuple[str, Optional[str], Any, dict[str, Any]]]" = OrderedDict()
        self._lock = threading.Lock()

    def add(self, run: Run) -> None:
        output = run.output
        data = {f: getattr(output, f) for f in run.schema.fields} if run.schema is not None and output is not None \
            else dict(output or {})
        with self._lock:
            self._states[run.run_id] = (run.pipeline, run.thread_id, run.schema, data)
            self._states.move_to_end(run.run_id)
            while len(self._states) > self.size:
                self._states.popitem(last=False)

    def get(self, run_id: str) -> Optional[tuple[str, Optional[str], Any, dict[str, Any]]]:
        with self._lock:
            return self._states.get(run_id)

    def clear(self) -> None:
        with self._lock:
            self._states.clear()


class StoreListener:
    """Records runs into one store with one durability (see the module docstring)."""

    def __init__(self, writer: Writer, journal: Any, lease: Optional[str], durability: str, recent: Recent) -> None:
        if durability not in ("run", "stage"):
            raise TracememError(f"durability must be 'run' or 'stage', got {durability!r}")
        self.writer, self.journal, self.lease, self.recent = writer, journal, lease, recent
        self.stage = self.steps = durability == "stage"  # (durability "run" needs no step events: events.py)
        self.defer_sync = self.stage and getattr(journal, "fsync", False)  # a stage's sync waits for the next step
        self.step_starts = self.defer_sync  # (only a deferred sync needs to hear a step start)
        self.unsynced = False
        self.resumed: dict[str, tuple[Any, ...]] = {}  # resumed runs: their record's counts when resumed
        self.runs: dict[str, RunFacts] = {}  # durability "stage" runs going on: what the writer needs of each

    def __call__(self, event: Any) -> None:
        if isinstance(event, StepFinished):
            if self.stage:
                self._stage(event)
        elif isinstance(event, StepStarted):
            if self.unsynced:  # the stage before this step becomes power-loss safe before this step's stage runs
                self.unsynced = False
                try:
                    self.journal.sync()
                except OSError as err:
                    raise self.writer.stop_accepting(err, f"syncing run {event.run_id}'s journal") from err
        elif isinstance(event, RunStarted):
            self._began(event.run, event.resumed)
        elif isinstance(event, ENDS):
            self._ended(event.run)

    def _began(self, run: Run, resumed: Optional[tuple[Any, ...]]) -> None:
        if self.writer.queue.failure is not None:  # a store whose file failed accepts no new runs
            raise StoreError(str(self.writer.queue.failure)) from self.writer.queue.failure.__cause__
        if resumed is not None:
            self.resumed[run.run_id] = resumed
        if self.stage:
            facts = self.runs[run.run_id] = RunFacts.of(run)  # (taken once: a stage's piece carries them as it began)
            if resumed is None:  # (with a deferred sync, its first stage's sync covers it: N stages, N syncs)
                self._put(facts, begin_entry(run, self.lease), run_row(run, self.lease), NOTHING, None, 1,
                          sync=not self.defer_sync)

    def _stage(self, event: StepFinished) -> None:
        facts = self.runs.get(event.run_id)
        if facts is None:
            return
        records = plain_records((event.record,), event.reads, event.writes,
                                (event.decision,) if event.decision else (), event.rows)
        self._put(facts, step_entry(facts.run_id, records), None, records, None, cost_of(records),
                  sync=not self.defer_sync)
        self.unsynced = self.defer_sync

    def _ended(self, run: Run) -> None:
        mark = self.resumed.pop(run.run_id, None)
        facts = RunFacts.of(run)
        if self.stage or mark is not None:  # its runs row is in: it gets what came since, and its end facts
            self.runs.pop(run.run_id, None)
            if mark is not None and not self.stage:  # (a "stage" run's steps went one by one)
                part = run_records(run, since=mark)
                self._put(facts, step_entry(run.run_id, part), None, part, None, cost_of(part, run), sync=False)
            self._put(facts, end_entry(run), None, NOTHING, end_facts(run), 1)
        else:
            records = run_records(run)
            self._put(facts, run_entry(run, self.lease, records), run_row(run, self.lease), records, None,
                      cost_of(records, run))
        self.unsynced = False
        if run.status in ("ok", "paused") and run.parent_run_id is None:
            self.recent.add(run)

    def _put(self, facts: RunFacts, entry: Entry, row: Optional[tuple], records: Records,
             end: Optional[dict[str, Any]], cost: int, sync: bool = True) -> None:
        """Journal an entry, then queue its piece (under the journal's lock: the writer meets them in order)."""
        if self.journal is None:
            self.writer.queue.put(Piece(facts, row, records, end, None, cost))
            return
        with self.journal.lock:
            try:
                position = self.journal.append(entry, sync)
            except OSError as err:  # the journal's disk: the store stops accepting runs, loudly
                raise self.writer.stop_accepting(err, f"journaling run {facts.run_id}") from err
            self.writer.queue.put(Piece(facts, row, records, end, position, cost))


def cost_of(records: Records, run: Optional[Run] = None) -> int:
    """The writer's work for a piece: rows, plus one per 64 characters of recorded text (with `run`, the piece
    holds the run's input and output too)."""
    steps, reads, writes, decisions, rows = records
    text = sum(len(w[4]) for w in writes if w[4])  # (plain tuples: a write's value is its fifth item)
    if run is not None:
        text += len(run.input_json or "") + len(run.output_json or "")
    return 1 + len(steps) + len(reads) + len(writes) + len(decisions) + len(rows) + text // 64
