"""The backlog: finished runs waiting for the background writer, bounded so that a producer
faster than the writer waits instead of piling up runs a crash would lose.

`flow.run` waits in `put` while the queue is full. Its bound is in *cost*, an
estimate of the writer's work: one unit per row, plus one per 64 characters of
recorded text (a run writing a 20 kB value costs as much as ~300 small rows). The
bound is the smaller of `max_cost` (memory) and what the writer can write in
`max_lag` seconds at the rate it has been writing (time: a slow disk, or producers
starving the writer of the GIL, shrink it; never below one batch). The oldest run
not yet on disk may not be older than `max_lag` either. The writer `take`s at most
`batch_cost` at a time, so no single insert holds the file (or a waiting
`flow.run`) for long. A returned run thus waits for the disk about `max_lag` plus a
batch or two: that lag is what a SIGKILL can lose. The backlog keeps its maximum
(`status()`), which bench/store.py prints.

Once writing fails because of the file (disk full, I/O error), `failure` is set:
`put` raises it, so `flow.run` stops accepting runs loudly, while the runs already
queued stay queued for the writer's retries.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import StoreError
from ..record import value_chars
from ..run import Run
from .batch import rows_since
from .log_codec import records

MAX_COST = 64_000
"""Default bound of the queue's cost: ~64k rows, or ~4 MB of recorded text."""
MAX_LAG = 0.25
"""Default bound, in seconds, of how long the oldest returned run may wait for the disk before flow.run waits."""
BATCH_COST = 32_000
"""Default bound of one batch (a single run larger than this is still written whole, alone)."""


def queued(run: Run, entries: Sequence[bytes] = ()) -> Run:
    """The run as the backlog keeps it: a Run with the same attributes (its notes and rows shared, so what
    the writer notes reaches the caller's Run), its steps, reads and writes as tuples of plain tuples, and
    without its final state object (`output_json` holds what the writer stores). Only the writer reads it.
    A run whose records are all in the journal (`entries`: one whole-run entry, or one per stage) keeps none:
    the writer folds the entries in as they are (store/entry_fold.py), and `restored` decodes them should it
    need the records after all.
    Why: runs wait for the writer long enough to be promoted to the garbage collector's oldest generation,
    and every full collection walks what is there; the more a run promotes, the more often one comes. The
    collector stops tracking a tuple of plain values (never a list, a NamedTuple or a pydantic model), so
    this copy promotes three objects where the caller's Run would promote ~15 (bytes: none)."""
    kept = object.__new__(Run)
    kept.__dict__ = run.__dict__.copy()  # (a copy keeps the keys Run's instances share: ~5,000 instructions fewer
    #                                      than `kept.__dict__.update(...)`, which adds them one by one)
    if entries:
        kept.set_records((), (), ())  # (one call: the three `Run.Records` setters cost ~3,000 instructions)
        kept.entries = tuple(entries)
    else:
        kept.set_records(tuple(map(tuple, run.raw_steps)), tuple(map(tuple, run.raw_reads)),
                         tuple(map(tuple, run.raw_writes)))
    kept.decisions, kept.children, kept.links = tuple(run.decisions), tuple(run.children), tuple(run.links)
    kept.output = None
    return kept


def restored(run: Run) -> Run:
    """A queued run with its steps, reads and writes back from its journal entries, if it has them (to be
    written the Python way: after a batch whose entries SQL could not fold, or part of a run already written)."""
    if run.entries:
        steps, reads, writes = records(run.entries)
        run.steps, run.reads, run.writes, run.entries = tuple(steps), tuple(reads), tuple(writes), ()
    return run


_FROM_THE_START = (0, 0, 0, 0, {})  # a Mark (batch.py) before anything was recorded; never changed


def cost_of(run: Run) -> int:
    """The writer's work for a run: rows, plus one per 64 characters of JSON values and extra rows' text
    (of a resumed run, only what came after the resume: its record before is in the tables already)."""
    steps, reads, writes, decisions, counts = run.resumed_from or _FROM_THE_START
    extra = rows_since(run, counts) if run.rows else ()  # (once per run: most runs have no extra rows)
    rows = (1 + len(run.raw_steps) - steps + len(run.raw_reads) - reads + len(run.raw_writes) - writes
            + len(run.decisions) - decisions + len(extra))
    text = (len(run.input_json or "") + len(run.output_json or "")
            + value_chars(run.raw_writes[writes:] if writes else run.raw_writes))
    for _, row in extra:
        for value in row.values():
            if type(value) is str:
                text += len(value)
    return rows + text // 64


@dataclass
class Taken:
    """Runs taken for one batch: they count as being written until `Backlog.written` or `put_back` (a flush
    may write some beside the background writer's batch, so two can be out at once)."""

    runs: list[Run]
    costs: list[int]  # each run's cost, as queued
    since: float  # when the oldest of them was queued
    at: float  # when they were taken


@dataclass
class BacklogStatus:
    """A look at the backlog: queued runs and cost now, and how far behind the writer is and was."""

    queued_runs: int
    queued_cost: int
    oldest_age_s: float  # how long the oldest run not yet on disk (queued or being written) has waited
    peak_runs: int
    peak_cost: int
    peak_lag_s: float  # the longest any run waited between flow.run returning and being on disk
    producer_waits: int  # times flow.run waited for room


class Backlog:
    """A FIFO of finished runs, bounded in cost; thread-safe."""

    def __init__(self, max_cost: int = MAX_COST, batch_cost: int = BATCH_COST, max_lag: float = MAX_LAG) -> None:
        if max_cost < 1 or batch_cost < 1 or not max_lag > 0:
            raise StoreError(f"queue bounds must be positive, got max_queue={max_cost}, max_batch={batch_cost}, "
                             f"max_lag={max_lag}")
        self.max_cost, self.batch_cost, self.max_lag = max_cost, batch_cost, max_lag
        # what the writer waits to gather (else its interval) before writing: less would not pay for a batch's
        # fixed cost (~7 ms of CPU and a synced commit), more would leave a flush more to write
        self.gather = max(1, batch_cost // 8)
        self.failure: Optional[StoreError] = None  # set while the file cannot be written
        self.closed = False
        self._cv = threading.Condition()
        self._runs: deque[Run] = deque()
        self._items: deque[tuple[int, float, int]] = deque()  # each run's cost, queued at, sequence number
        # (apart from the runs: a tuple of plain values is one object fewer for the garbage collector to walk)
        self._cost = 0
        self.seq = 0  # the sequence number of the last run queued
        self._out: list[Taken] = []  # the batches being written
        self._rate: Optional[float] = None  # cost units the writer writes per second (moving average)
        self._last_written: Optional[float] = None  # when the last batch was written, if runs were left queued
        self._peak_runs = self._peak_cost = self._waits = 0
        self._waiting = 0  # producers waiting for room now
        self._peak_lag = 0.0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def cost(self) -> int:
        """The cost of the runs queued now (not those being written)."""
        return self._cost

    def put(self, run: Run, cost: int) -> None:
        """Queue a finished run; waits while the queue is full or too far behind (a run costlier than the
        bound waits for an empty queue); raises the store's failure once writing has failed."""
        with self._cv:
            now = time.monotonic()
            if self._full(cost, now) and self.failure is None:
                self._waits += 1
                self._waiting += 1
                try:
                    while self._full(cost, now) and self.failure is None and not self.closed:
                        self._cv.notify_all()  # the writer must not sleep out its interval now
                        self._cv.wait(0.5)
                        now = time.monotonic()
                finally:
                    self._waiting -= 1
            if self.failure is not None:
                raise StoreError(str(self.failure)) from self.failure.__cause__
            self.seq += 1
            self._runs.append(run)
            self._items.append((cost, now, self.seq))
            self._cost += cost
            if len(self._items) > self._peak_runs:
                self._peak_runs = len(self._items)
            if self._cost > self._peak_cost:
                self._peak_cost = self._cost
            if self._cost >= self.gather:
                self._cv.notify_all()

    def _full(self, cost: int, now: float) -> bool:
        items = self._items
        rate_bound = 4 * self.batch_cost if self._rate is None else int(self._rate * self.max_lag)
        bound = min(self.max_cost, max(self.batch_cost, rate_bound))  # until measured: four batches
        if items and self._cost + cost > bound:
            return True
        oldest = self._oldest()
        return oldest is not None and now - oldest > self.max_lag

    def _oldest(self) -> Optional[float]:
        """When the oldest run not yet on disk (being written, else queued) was queued."""
        out = self._out
        if out:  # (one batch out, but for a flush writing beside the background thread's)
            return out[0].since if len(out) == 1 else min(taken.since for taken in out)
        return self._items[0][1] if self._items else None

    def take(self, upto: Optional[int] = None) -> Taken:
        """The oldest runs (queued no later than sequence number `upto`), up to one batch's cost (at least
        one run, none if none is queued)."""
        with self._cv:
            runs: list[Run] = []
            costs: list[int] = []
            cost = 0
            items = self._items
            since = 0.0
            while items and (upto is None or items[0][2] <= upto) and (
                    not runs or cost + items[0][0] <= self.batch_cost):
                c, at, _ = items.popleft()
                if not runs:
                    since = at
                runs.append(self._runs.popleft())
                costs.append(c)
                cost += c
            self._cost -= cost
            taken = Taken(runs, costs, since, time.monotonic())
            if runs:
                self._out.append(taken)
            return taken

    def written(self, taken: Taken) -> None:
        """These runs are on disk: make room for waiting producers."""
        with self._cv:
            now = time.monotonic()
            self._out.remove(taken)
            self._peak_lag = max(self._peak_lag, now - taken.since)
            # the rate the queue drains at: from the previous batch's end when the writer went straight on
            # (the time between batches counts: producers take the GIL there), else from this batch's start
            last = self._last_written
            start = last if last is not None and last <= taken.at else taken.at
            cost = sum(taken.costs)
            if cost and now > start:
                rate = cost / (now - start)
                self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
            self._last_written = now if self._items else None
            self.failure = None
            self._cv.notify_all()

    def put_back(self, taken: Taken, runs: list[Run], failure: Optional[StoreError]) -> None:
        """Runs taken but not written (the last of those `taken`) go back to the front, oldest first, at the
        cost they were queued at; `failure` says why (None: no failure of the file, nor news of one)."""
        with self._cv:
            self._out.remove(taken)
            costs = taken.costs[len(taken.costs) - len(runs):] if runs else []
            self._runs.extendleft(reversed(runs))
            self._items.extendleft((c, taken.since, 0) for c in reversed(costs))
            self._cost += sum(costs)
            if failure is not None:
                self.failure = failure
            self._cv.notify_all()

    def wait_for_work(self, interval: float) -> bool:
        """For the writer thread: sleep up to `interval` unless `gather` is queued or a producer waits (after a
        failure: the full interval); False once closed."""
        with self._cv:
            if not self.closed and (self.failure is not None or (self._cost < self.gather and not self._waiting
                                                                  and not self._full(0, time.monotonic()))):
                self._cv.wait(interval)
            return not self.closed

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def status(self) -> BacklogStatus:
        with self._cv:
            now = time.monotonic()
            oldest = self._oldest()
            return BacklogStatus(len(self._items), self._cost, 0.0 if oldest is None else now - oldest,
                                 self._peak_runs, self._peak_cost, self._peak_lag, self._waits)
