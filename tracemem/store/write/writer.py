"""The writer: moves what the listener queued (store/write/listener.py) into the tables, in batches.

A background thread takes what is queued — each a `Piece` of a run: its runs row, its
records, its end facts — and writes it as one transaction of Arrow tables per batch
(store/write/rows.py). It wakes every `flush_interval` seconds, or at once when a batch's
worth has gathered or a producer waits for room, and writes what is queued then: few, full
batches, since each DuckDB call from this thread takes the GIL from the runs being recorded.
`flush()` writes the rest in the caller's thread. With each batch goes the journal position
it reaches, so the journal (store/write/journal.py) replays, after a crash, exactly what the
tables do not hold yet. A piece queued right after another of the same run joins it (a
"stage" run's stages are written as one piece, not one each).

The queue is bounded: a producer waits while it holds more than `max_queue` cost units
(a unit is a row, or 64 characters of recorded text) or while its oldest piece has waited
longer than `max_lag` seconds, so a producer faster than the disk is slowed to its pace.

What fails is told apart (the backend says which failures are momentary):
- momentary (a busy connection, a write conflict, an interrupted call, a dropped
  PostgreSQL session): the batch is written again, whole, with a wait that doubles, for up
  to `PATIENCE` seconds (only what a failed attempt did not commit);
- data the tables cannot hold: the batch is written again with every value made storable
  (each change noted on its run), then run by run, a run that still fails without its extra
  rows, then as its runs row alone, saying so in `runs.notes`; the next `flush()` raises it;
- the file itself (disk full, I/O error, a momentary failure that lasted): the store stops
  accepting runs, loudly, and keeps what is queued, retrying every `RETRY_INTERVAL`.
What fails once a batch is in (emptying the journal, telling the store) is raised by the next
`flush()`, never a reason to write the batch again; an interrupt (KeyboardInterrupt in a flush)
puts what it did not write back in the queue.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Optional, Sequence

from ...errors import StoreError, TracememError
from ...text import clip
from ..backend import Writes
from ..diagnose import first_line, storage_failure
from ..read.snapshots import embedding_rows
from .rows import META_SQL, Batch, Piece

__all__ = ["Piece", "Writer", "MAX_COST", "MAX_LAG", "BATCH_COST", "PATIENCE"]

MAX_COST = 64_000  # default bound of the queue: ~64k rows, or ~4 MB of recorded text
MAX_LAG = 0.25  # default bound, in seconds, of how long the oldest queued piece may wait before producers wait
BATCH_COST = 32_000  # default bound of one batch (a single larger piece is still written whole)
PATIENCE, FIRST_WAIT, LONGEST_WAIT = 5.0, 0.005, 0.5  # seconds of momentary failures; the waits between tries
RETRY_INTERVAL = 1.0  # seconds between retries once the file could not be written


class StillFailing(StoreError):
    """A momentary failure that went on for longer than `PATIENCE`: from then on the file's failure."""


class PieceQueue:
    """The bounded queue between the listener and the writer (see the module docstring): a producer waits while
    it is full, the writer's thread sleeps until enough has gathered; `failure` is the store's, once its file
    failed (then `put` raises it)."""

    def __init__(self, max_queue: int, max_batch: int, max_lag: float) -> None:
        if max_queue < 1 or max_batch < 1 or not max_lag > 0:
            raise StoreError(f"queue bounds must be positive, got max_queue={max_queue}, max_batch={max_batch}, "
                             f"max_lag={max_lag}")
        self.max_queue, self.max_batch, self.max_lag = max_queue, max_batch, max_lag
        self.failure: Optional[StoreError] = None
        self.closed = False
        self.seq = 0  # the number of the last piece queued
        self._items: deque[tuple[Piece, float, int]] = deque()  # each with when it was queued, its number
        self._cost = 0
        self._waiting = 0  # producers waiting for room now: the writer must not sleep out its interval
        self.cv = threading.Condition()
        self.peak_lag = 0.0  # the longest a piece waited to be written (bench/store.py prints it)
        self.peak_cost = self.peak_pending = self.producer_waits = 0  # the most queued; how often a producer waited

    def __len__(self) -> int:
        return len(self._items)

    def oldest_age(self) -> float:
        """How long the oldest queued piece has waited, in seconds (bench/pressure.py samples it)."""
        with self.cv:
            return time.monotonic() - self._items[0][1] if self._items else 0.0

    def put(self, piece: Piece) -> None:
        """Queue a piece (waits while the queue is full); raises the store's failure once writing failed."""
        with self.cv:
            now = time.monotonic()
            if self._full(piece.cost, now):
                self.producer_waits += 1
                self._waiting += 1
                try:
                    while self._full(piece.cost, now):
                        self.cv.notify_all()  # the writer must not sleep out its interval now
                        self.cv.wait(0.5)
                        now = time.monotonic()
                finally:
                    self._waiting -= 1
            if self.failure is not None:
                raise StoreError(str(self.failure)) from self.failure.__cause__
            self.seq += 1
            last = self._items[-1] if self._items else None
            if last is not None and last[0].run.run_id == piece.run.run_id and last[0].end is None and piece.row is None:
                self._items[-1] = (last[0].merged(piece), last[1], last[2])  # a "stage" run's next piece
            else:
                self._items.append((piece, now, self.seq))
            self._cost += piece.cost
            self.peak_cost, self.peak_pending = max(self.peak_cost, self._cost), max(self.peak_pending, len(self._items))
            if self._cost >= self.max_batch:
                self.cv.notify_all()

    def _full(self, cost: int, now: float) -> bool:
        return self.failure is None and not self.closed and bool(self._items) and (
            self._cost + cost > self.max_queue or now - self._items[0][1] > self.max_lag)

    def wait_for_work(self, interval: float) -> bool:
        """For the writer's thread: sleep up to `interval` (after a failure: `RETRY_INTERVAL`) unless a batch's
        worth has gathered or a producer waits; False once closed."""
        with self.cv:
            if not self.closed and not self._waiting and (self.failure is not None or
                                                          self._cost < self.max_batch):
                self.cv.wait(RETRY_INTERVAL if self.failure is not None else interval)
            return not self.closed

    def take(self, upto: Optional[int]) -> list[Piece]:
        """The oldest pieces (queued no later than number `upto`), up to a batch's cost (at least one)."""
        with self.cv:
            taken: list[Piece] = []
            cost = 0
            while self._items and (upto is None or self._items[0][2] <= upto) and (
                    not taken or cost + self._items[0][0].cost <= self.max_batch):
                piece, queued, _ = self._items.popleft()
                self.peak_lag = max(self.peak_lag, time.monotonic() - queued)
                taken.append(piece)
                cost += piece.cost
            self._cost -= cost
            return taken

    def put_back(self, pieces: list[Piece], failure: Optional[StoreError]) -> None:
        """Pieces taken but not written go back to the front; `failure` says why (None: none of the file's)."""
        with self.cv:
            now = time.monotonic()
            self._items.extendleft((p, now, 0) for p in reversed(pieces))
            self._cost += sum(p.cost for p in pieces)
            self.failure = failure or self.failure
            self.cv.notify_all()

    def settle(self, failure: Optional[StoreError]) -> None:
        """The store's failure is now `failure` (None: a batch went in); producers waiting are told."""
        with self.cv:
            self.failure = failure
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class Writer:
    """The thread that writes what is queued (see the module docstring); `queue` is what the listener fills."""

    def __init__(self, target: Optional[Writes], path: str, lease: Optional[str], *, flush_interval: float = 0.05,
                 max_queue: int = MAX_COST, max_batch: int = BATCH_COST, max_lag: float = MAX_LAG,
                 embedder: Any = None, on_written: Callable[[Batch], None] = lambda batch: None) -> None:
        self.target, self.path, self.lease = target, path, lease  # (None: a read-only store, which never writes)
        self.queue = PieceQueue(max_queue, max_batch, max_lag)
        self.interval = flush_interval if flush_interval > 0 else 0.05
        self.embedder = embedder  # embeds finished runs' queries (load_snapshot's index; None: no embeddings)
        self.journal_rows = target is not None and target.journal_rows  # step_journal rows go with what is written
        self.on_written = on_written  # told of each batch once it is in (on the writing thread)
        self.errors: list[BaseException] = []  # what went wrong since the last flush(), which raises it
        self._flushes = 0  # flush() calls waiting or writing: the thread leaves the queue to them
        self._write_lock = threading.Lock()  # one batch at a time (the thread's, or a flush's)
        self._thread: Optional[threading.Thread] = None
        self._batches = 0  # batches committed (each batch's token: see `commit`)

    def start(self) -> None:
        """Start the background thread (the store does, once open)."""
        with self.queue.cv:
            if self._thread is None and not self.queue.closed:
                self._thread = threading.Thread(target=self._loop, name="tracemem-writer", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while self.queue.wait_for_work(self.interval):
            try:
                self.drain(chase=True)
            except BaseException as err:  # noqa: BLE001 - the thread lives on; flush() reports it
                self.errors.append(err)
                time.sleep(0.1)

    # -- writing -----------------------------------------------------------------------------
    def drain(self, chase: bool = False) -> None:
        """Write what is queued now, batch after batch (stops at a failure of the file). `chase` (the thread): stop
        when a flush() waits (the flush writes the rest itself). What is queued meanwhile waits for the thread's
        next wake-up: fewer, fuller batches take the GIL from the runs being recorded less often."""
        with self._write_lock:
            upto = self.queue.seq
            while not (chase and self._flushes):
                pieces = self.queue.take(upto)
                if not pieces or not self._write(pieces):
                    return
                self.queue.settle(None)

    def flush(self) -> None:
        """Write everything queued now; raise what went wrong since the last flush (the store's failure first)."""
        queue = self.queue
        if queue.failure is None:
            with queue.cv:
                self._flushes += 1
            try:
                self.drain()
            finally:
                with queue.cv:
                    self._flushes -= 1
        if queue.failure is not None:
            raise StoreError(str(queue.failure)) from queue.failure.__cause__
        if self.errors:
            errors, self.errors = self.errors, []
            first = errors[0]
            if isinstance(first, TracememError) and len(errors) == 1:
                raise first
            raise TracememError(f"{len(errors)} problem(s) writing to {self.path}; the first: {first}") from first

    def close(self) -> None:
        """Write what is queued and stop the thread."""
        self.queue.close()
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        self.drain()

    def _write(self, pieces: list[Piece]) -> bool:
        """Write pieces as one batch (run by run when that fails on data); False when the file failed. An
        interrupt (KeyboardInterrupt in a flush) puts them back, unwritten, and goes on up."""
        try:
            self.commit(self._batch(pieces, "whole"))
        except Exception as err:
            if _file_failure(err) is not None:
                self.queue.put_back(pieces, self._failed(err, f"writing {len(pieces)} piece(s) of runs"))
                return False
            return self._write_each(pieces)
        except BaseException:
            self.queue.put_back(pieces, None)
            raise
        return True

    def _batch(self, pieces: Sequence[Piece], level: str, notes: Optional[list[str]] = None) -> Batch:
        batch = Batch(self.lease)
        if notes:  # what a degraded write lost, said on its run's row
            batch.notes[pieces[0].run.run_id] = notes
        for piece in pieces:
            batch.add(piece, extra=level == "whole", records=level != "row only")
            if self.journal_rows:  # its step_journal rows: all of them once the run is whole in the tables
                steps = piece.records[0]
                batch.journaled.append((piece.run.run_id, None if piece.end is not None
                                        else [0] * (piece.row is not None) + [s[0] for s in steps]))
        ended = [p.run for p in pieces if (p.end is not None or p.records[0]) and p.run.query]
        if level == "whole" and ended and self.embedder is not None:
            batch.add_embeddings(embedding_rows(self.embedder, ended))
        return batch

    def commit(self, batch: Batch) -> None:
        """Insert a batch as one transaction, again after a momentary failure (then only what an attempt that
        failed after its commit did not write: the journal position it reached tells)."""
        self._batches += 1
        batch.token = f"{self._batches}"
        attempt, waited, wait = 0, 0.0, FIRST_WAIT
        while True:
            try:
                if attempt and self.target.meta(f"batch:{self.lease}") == batch.token:
                    break  # the answer to its commit was lost, not the commit
                self.target.insert(batch)
                break
            except Exception as err:
                why = self.target.transient(err)
                if why is None:
                    raise
                if waited >= PATIENCE:
                    raise StillFailing(f"{why} (still failing after {attempt + 1} tries in {waited:.1f} s)") from err
            try:
                self.target.reset()
            except Exception:  # noqa: BLE001 - a server still away: the next attempt fails again and says why
                pass
            time.sleep(wait)
            waited, wait, attempt = waited + wait, min(wait * 2, LONGEST_WAIT), attempt + 1
        try:  # the batch is in: nothing that fails now may write it again (it is said by the next flush())
            journal = self.target.journal
            if batch.position is not None and batch.position == getattr(journal, "size", None):  # all of it is in
                journal.empty(batch.position,
                              lambda: self.target.con.execute(META_SQL, ["journal_applied", "0"]))
            self.on_written(batch)
        except Exception as err:  # noqa: BLE001 - the journal replays nothing the tables hold (journal_applied)
            self.errors.append(err)

    def _write_each(self, pieces: list[Piece]) -> bool:
        """After a batch failed on data: piece by piece, so one bad run never blocks the others (see the module
        docstring); each loss said in the run's notes and raised by the next flush()."""
        for i, piece in enumerate(pieces):
            first: Optional[BaseException] = None
            for level in ("whole", "without extras", "row only"):
                kept = len(piece.run.notes)
                try:
                    note = [_loss(piece, level, first)] if first is not None else []
                    piece.run.notes.extend(note)
                    self.commit(self._batch([piece], level, note))
                except Exception as err:
                    del piece.run.notes[kept:]
                    if _file_failure(err) is not None:
                        self.queue.put_back(pieces[i:], self._failed(err, f"writing run {piece.run.run_id}"))
                        return False
                    first = first or err
                    continue
                except BaseException:  # an interrupt: this piece and the rest go back, unwritten
                    del piece.run.notes[kept:]
                    self.queue.put_back(pieces[i:], None)
                    raise
                if first is not None:
                    self.errors.append(TracememError(f"run {piece.run.run_id} of '{piece.run.pipeline}': "
                                                     f"{piece.run.notes[-1]}"))
                break
            else:
                self.errors.append(TracememError(f"run {piece.run.run_id} of '{piece.run.pipeline}' could not be "
                                                 f"written to {self.path}: {first}"))
        return True

    def stop_accepting(self, err: BaseException, what: str) -> StoreError:
        """The journal could not be written: the store stops accepting runs (what is queued stays queued)."""
        failure = self._failed(err, what)
        self.queue.settle(failure)
        return failure

    def _failed(self, err: BaseException, what: str) -> StoreError:
        """A failure of the file itself: the store stops accepting runs until a retry succeeds."""
        failure = StoreError(
            f"the store {self.path} stopped accepting runs: {what} failed because "
            f"{_file_failure(err) or first_line(err)}. Runs already returned by flow.run stay queued (and "
            f"journaled) and are retried every {RETRY_INTERVAL:g} s; free disk space (or fix the file's storage)")
        failure.__cause__ = err
        return failure


def _file_failure(err: BaseException) -> Optional[str]:
    """What is wrong with the file when `err` means it cannot be written now; None when the data is at fault."""
    return storage_failure(err) or (first_line(err) if isinstance(err, StillFailing) else None)


def _loss(piece: Piece, level: str, err: BaseException) -> str:
    why = f"{type(err).__name__}: {clip(first_line(err), 200)}"
    if level == "without extras":
        tables = {t for t, _ in piece.records[4] if not t.startswith("_")}
        extra = ", ".join(sorted(tables) + (["query embedding"] if piece.run.query else []))
        return f"written without its {extra or 'extra rows'}, which could not be written: {why}"
    return f"only its runs row was written; its steps, reads, writes and rows could not be: {why}"
