"""The writer: everything about getting runs from the runner to disk.

It owns the backlog of finished runs (store/backlog.py), the background thread that
writes them in columnar batches, the step journal, and each run's progress towards
its tables. The runner reaches it only through `StoreSink` (store/store_sink.py, what `Store.sink()` returns).

Durability "run" (default): a finished run is queued whole and written by the
background thread within `flush_interval` seconds, or once an eighth of a batch has
gathered, batch after batch while runs come (and on flush/close/exit/SIGTERM); the
thread runs at a lower CPU priority than the flows (store/background_priority.py).
On a DuckDB file, what reaches the tables of a run's records comes from the journal
entries that made them durable, which DuckDB folds in off the GIL (store/entry_fold.py);
while the writer writes, the interpreter switches threads every 0.5 ms (store/switching.py).
On a DuckDB file it is first appended to the run journal (store/run_log.py), and on
PostgreSQL committed as a `step_journal` row (`journal_each_run`), so a process crash loses
no run `flow.run` returned; on `:memory:` a crash loses everything anyway (`flush_interval=0`
journals there too). The queue is bounded (`flow.run` waits for room).
Durability "stage": each finished stage is journaled before the next starts (the run
journal on a file; `step_journal` rows elsewhere, after the runs row is written when
the run starts); reopening after a crash replays the journal and marks such a run
`interrupted`.

The writer has a connection of its own (the backend's `writer_con`), which nothing else uses. A write
that fails for a moment (a conflict, a busy call, a dropped session) is made again, whole (store/retry.py);
a batch that committed is never written again, even when the answer to its commit was lost.
Nothing one run holds can stop the others: a batch that fails on a value is written
run by run (store/batch.py makes values storable first, noting each change on its
run); a run that still fails is written without its extra rows, or as its runs row
alone, saying why in `runs.notes`. A failure of the file itself (disk full, I/O
error) stops the store accepting runs, loudly, until a retry succeeds.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

from ..errors import StoreError, TracememError
from ..run import Run
from ..text import clip
from .background_priority import lower_this_thread
from .backlog import BATCH_COST, MAX_COST, MAX_LAG, Backlog, Taken, cost_of, restored
from .batch import Batch, Progress, mark_of, run_row
from .diagnose import first_line, storage_failure
from .retry import StillFailing, patiently
from .segment_log import JournalError
from .snapshots import embedding_rows
from .switching import quick_switching

RETRY_INTERVAL = 1.0  # seconds between the writer's retries once the file could not be written


def file_failure(err: BaseException) -> Optional[str]:
    """What is wrong with the file when `err` means it cannot be written now: a storage failure, or a
    momentary one that lasted (store/retry.py); None when the data is at fault."""
    return storage_failure(err) or (first_line(err) if isinstance(err, StillFailing) else None)


class Writer:
    """Writes finished runs (and journaled stages) into the store's tables."""

    def __init__(self, backend: Any, path: str, flush_interval: float, snapshot_embedder: Any,
                 on_embeddings: Callable[[list[tuple]], None], lease: Optional[str] = None,
                 max_queue: int = MAX_COST, max_batch: int = BATCH_COST, max_lag: float = MAX_LAG,
                 on_end: Callable[[Run], None] = lambda run: None,
                 on_written: Callable[[int], None] = lambda count: None) -> None:
        self.backend = backend  # where batches and journal rows go (store/backend.py)
        self.runlog = backend.run_log  # a DuckDB file's run journal (store/run_log.py), else None
        self.lock = backend.write_lock
        self.path = path
        self.flush_interval = flush_interval  # seconds a finished run may wait for its batch
        # each run is committed as a step_journal row before flow.run returns (PostgreSQL, a file-less
        # store with flush_interval=0); a DuckDB file's run journal does that job there (`runlog`)
        self.journal_each_run = self.runlog is None and (backend.journal_runs or flush_interval <= 0)
        self.snapshot_embedder = snapshot_embedder
        self.on_embeddings = on_embeddings  # told about new run embeddings once they are in the tables
        self.on_end = on_end  # told about each run as it ends (the store keeps its state for resume=<run id>)
        self.on_written = on_written  # told how many runs each batch wrote, on this thread (the store grows)
        self.lease = lease  # this opening of the file, recorded on every runs row (see opening.recover_dead_runs)
        self.progress: dict[str, Progress] = {}  # journaled runs not yet moved whole into the tables
        self.inflight: dict[str, Run] = {}  # durability "stage" runs still running
        self.backlog = Backlog(max_queue, max_batch, max_lag)
        self.errors: list[BaseException] = []
        self._drain_lock = threading.Lock()
        self._flushes = 0  # flush() calls waiting or writing: the background thread leaves the queue to them
        self._flushes_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    @property
    def pending(self) -> int:
        """How many finished runs are queued for the writer."""
        return len(self.backlog)

    # -- durable progress --------------------------------------------------------------
    def check(self) -> None:
        """Raise the store's failure if the file could not be written (flow.run stops accepting runs)."""
        failure = self.backlog.failure
        if failure is not None:
            raise StoreError(str(failure)) from failure.__cause__

    def _failed(self, err: BaseException, what: str) -> StoreError:
        """A failure of the file itself: remembered (so the store stops accepting runs) and returned."""
        failure = StoreError(
            f"the store {self.path} stopped accepting runs: {what} failed because "
            f"{file_failure(err) or first_line(err)}. "
            f"Runs already returned by flow.run stay queued in memory and are retried every {RETRY_INTERVAL:g} s; "
            f"free disk space (or fix the file's storage) before this process exits, or they are lost")
        failure.__cause__ = err
        return failure

    def write_now(self, batch: Batch) -> None:
        """Insert a batch as one transaction, again after a momentary failure (store/retry.py)."""
        self._insert(lambda _: batch)

    def _insert(self, build: Callable[[list[Run]], Batch], runs: Sequence[Run] = ()) -> None:
        """Insert the batch `build(runs)` makes, as one transaction, again after a momentary failure
        (store/retry.py): then for the runs an attempt that failed after its commit did not write, so no run
        is ever written twice."""
        def attempt(n: int) -> Optional[Batch]:
            todo = list(runs)
            if n and todo:
                todo = self._unwritten(todo)
                if not todo:
                    return None
            batch = build(todo)
            with self.lock:
                self.backend.insert(batch)
            return batch

        batch = patiently(attempt, self.backend.transient, self._reset)
        if batch is not None and batch.rows["run_embeddings"]:
            self.on_embeddings(batch.rows["run_embeddings"])  # (in memory only: cannot fail the commit made)

    def _reset(self) -> None:
        with self.lock:
            self.backend.reset_writer()

    def _unwritten(self, runs: list[Run]) -> list[Run]:
        """Those of `runs` whose batch has not committed: a committed one has its runs row with its end."""
        with self.lock:
            done = {r for (r,) in self.backend.writer_con.execute(
                "SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[])) AND status <> 'running'",
                [[run.run_id for run in runs]]).fetchall()}
        return [run for run in runs if run.run_id not in done]

    def write_durably(self, what: str, batch: Optional[Batch], journal: Optional[list[Any]] = None) -> None:
        """Write a batch (or one journal row, on the backend's own terms: PostgreSQL's has a connection of its
        own, so it never waits behind a batch) now, again after a momentary failure; a failure of the file (or a
        momentary one that lasts) stops the store."""
        self.check()
        try:
            if batch is not None:
                self.write_now(batch)
            else:
                patiently(lambda n: self.backend.journal(*journal), self.backend.transient, self._reset)
        except Exception as err:
            if file_failure(err) is None:
                raise
            failure = self._failed(err, what)
            self.backlog.failure = failure
            raise failure from err

    def journal(self, run_id: str, step: int, kind: str, payload: str) -> None:
        """One durable journal row (see store/journal.py)."""
        self.write_durably(f"journaling run {run_id}", None, [run_id, step, kind, payload])

    def logged(self, run: Run, append: Callable[..., Any], *args: Any) -> Any:
        """Append to the run journal (`append(run, *args)`, whose result it returns); a failure of its disk
        stops the store as a failed write does."""
        if self.backlog.failure is not None:
            self.check()
        try:
            return append(run, *args)
        except JournalError as err:
            raise self.journal_failed(run, err) from err

    def journal_failed(self, run: Run, err: JournalError) -> StoreError:
        """The run journal could not be appended to: the store stops accepting runs (see `_failed`)."""
        failure = self._failed(err.__cause__ or err, f"journaling run {run.run_id}")
        self.backlog.failure = failure
        return failure

    # -- the queue -----------------------------------------------------------------------
    def enqueue(self, run: Run, cost: Optional[int] = None) -> None:
        """Queue a finished run for the background writer (`cost`: `cost_of` the run as it ended, when what is
        queued is a copy without its records); waits while the queue is full."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="tracemem-writer", daemon=True)
                    self._thread.start()
        self.backlog.put(run, cost_of(run) if cost is None else cost)

    def _loop(self) -> None:
        lower_this_thread()  # the flows' threads run first (store/background_priority.py)
        interval = self.flush_interval if self.flush_interval > 0 else 0.05
        while self.backlog.wait_for_work(RETRY_INTERVAL if self.backlog.failure else interval):
            try:
                self.drain(chase=True)
            except BaseException as err:  # noqa: BLE001 - the thread must live on; flush() reports it
                self.errors.append(err)
                time.sleep(0.1)  # never spin on a failure that repeats

    def drain(self, chase: bool = False) -> None:
        """Write every run queued so far, in bounded batches (run by run where a batch fails), the interpreter
        handing this thread the GIL within 0.5 ms whenever it asks (store/switching.py).
        `chase` (the background thread): then the runs queued meanwhile, batch after batch while `backlog.gather`
        (an eighth of a batch's worth) has gathered each time and no flush() waits, rather than sleeping until more
        has: a writer that keeps up leaves a flush only the runs queued during its last batch. (A smaller batch
        would not pay for a batch's fixed cost, whose synced commit competes with an `fsync=True` store's flows.)"""
        backlog = self.backlog
        with self._drain_lock, quick_switching():
            upto = None if chase else backlog.seq
            while not (chase and self._flushes):  # (a flush waiting for this lock writes the rest itself)
                taken = backlog.take(upto)
                if not taken.runs or not self._write(taken) or chase and backlog.cost < backlog.gather:
                    return

    def _write(self, taken: Taken, runs: Optional[list[Run]] = None) -> bool:
        """Write the runs `taken` (or their copies `runs`) as one batch; False when the file failed (they are
        queued again). Runs whose records are in their journal entries are folded in from those
        (`Batch.add_journaled`), unless part of the run is in the tables already; a batch SQL could not fold is
        written again the Python way (`restored`)."""
        runs = taken.runs if runs is None else runs
        try:
            self._insert(self.batch_of, runs)
        except BaseException as err:
            if file_failure(err) is not None:
                self.backlog.put_back(taken, runs, self._failed(err, f"writing {len(runs)} runs"))
                return False
            if any(run.entries for run in runs):
                return self._write(taken, [restored(run) for run in runs])
            return self._write_each(taken, runs)
        self.done(taken)
        return True

    def batch_of(self, runs: list[Run]) -> Batch:
        """One batch of finished runs, with their snapshot embeddings."""
        batch = Batch(self.lease)
        for run in runs:
            progress = self.progress.get(run.run_id)
            if run.entries and (progress is None or progress.written is None and not progress.row):
                batch.add_journaled(run, whole=progress is None)
            else:
                batch.add_run(restored(run), progress)
        batch.add_embeddings(embedding_rows(self.snapshot_embedder, runs))
        return batch

    def done(self, taken: Taken) -> None:
        """These runs are in the tables (or given up, said in errors): forget them, and their journal. Nothing
        here may write them again: what fails now is said by the next flush()."""
        for run in taken.runs:
            self.progress.pop(run.run_id, None)
        try:
            if self.runlog is not None:
                self.runlog.written([run.run_id for run in taken.runs])
        except Exception as err:  # noqa: BLE001 - the runs are in the tables; the journal replays none twice
            self.errors.append(err)
        finally:
            self.backlog.written(taken)
        self.on_written(len(taken.runs))

    def _write_each(self, taken: Taken, runs: list[Run]) -> bool:
        """After a failed batch: write run by run, so one bad run never blocks the others. A run whose
        extra rows or query embedding cannot be written is written without them; one that still fails is
        written as its runs row alone; each says so in its notes. Errors are raised by the next flush()."""
        for i, run in enumerate(map(restored, runs)):
            first: Optional[BaseException] = None
            for level in ("whole", "without extras", "row only"):
                kept = len(run.notes)
                try:
                    if first is not None:
                        run.notes.append(self._loss_note(run, level, first))
                    self._insert(lambda todo: self._run_batch(run, level), [run])
                except BaseException as err:
                    del run.notes[kept:]
                    if file_failure(err) is not None:
                        self.backlog.put_back(taken, runs[i:], self._failed(err, f"writing run {run.run_id}"))
                        return False
                    first = first or err
                    continue
                if first is not None:
                    self.errors.append(TracememError(f"run {run.run_id} of '{run.pipeline}': {run.notes[-1]}"))
                break
            else:
                self.errors.append(TracememError(f"run {run.run_id} of '{run.pipeline}' could not be written to "
                                                 f"{self.path}: {first}"))
        self.done(taken)
        return True

    @staticmethod
    def _loss_note(run: Run, level: str, err: BaseException) -> str:
        why = f"{type(err).__name__}: {clip(first_line(err), 200)}"
        if level == "without extras":
            extra = ", ".join(sorted(t for t in run.rows if not t.startswith("_")) +
                              (["query embedding"] if run.query else []))
            return f"written without its {extra or 'extra rows'}, which could not be written: {why}"
        return f"only its runs row was written; its steps, reads, writes and rows could not be: {why}"

    def _run_batch(self, run: Run, level: str) -> Batch:
        batch = Batch(self.lease)
        if level == "row only":
            progress = self.progress.get(run.run_id) or Progress()
            batch.add_run(run, Progress(journal=progress.journal, written=mark_of(run)), extra=False)
            return batch
        batch.add_run(run, self.progress.get(run.run_id), extra=level == "whole")
        if level == "whole":
            batch.add_embeddings(embedding_rows(self.snapshot_embedder, [run]))
        return batch

    def _write_beside(self) -> None:
        """If a batch is being written (most often by the background thread), write (up to a batch of) what is
        queued now beside it, on the backend's second connection; a flush then waits for that batch as before.
        Why: a flush used to wait for the batch in flight (half a batch's time on average, ~10 ms at the rate
        bench/peers.py produces runs), then write the runs queued meanwhile (DuckDB's fixed ~7 ms a batch, then
        ~40 µs a run), one after the other, while the flow's thread waited. DuckDB commits two transactions
        appending to the same tables side by side, both off the GIL. An optimisation only: what does not go in
        beside (a failure of any kind; PostgreSQL's one connection) goes back to the front of the queue, for
        the drain that follows, which has every fallback."""
        backlog = self.backlog
        if not self._drain_lock.locked() or backlog.failure is not None:
            return
        taken = backlog.take(backlog.seq)
        if not taken.runs:  # none queued (or the background thread took them meanwhile)
            return
        try:
            batch = self.batch_of(taken.runs)
            beside = self.backend.insert_beside(batch)
        except Exception:  # noqa: BLE001 - the drain writes them again, with its fallbacks, and says what fails
            beside = False
        if not beside:
            backlog.put_back(taken, taken.runs, None)
            return
        if batch.rows["run_embeddings"]:
            self.on_embeddings(batch.rows["run_embeddings"])
        self.done(taken)

    def materialize(self) -> None:
        """Move the finished stages of running "stage" runs from the journal into their tables,
        so a query sees every finished stage (runs end up whole either way)."""
        with self._drain_lock:
            for run in list(self.inflight.values()):
                progress = self.progress.get(run.run_id)
                done = progress.done if progress is not None else None
                if progress is None or done is None or done == progress.written:
                    continue
                batch = Batch(self.lease)
                if not progress.row:  # journaled by the run journal: its runs row is not in the tables yet
                    batch.rows["runs"].append(run_row(run, self.lease))
                batch.add_part(run, progress.written, done)
                start = progress.written[0] if progress.written else 0
                if self.runlog is None:
                    batch.journaled_steps.append((run.run_id, [s[0] for s in run.raw_steps[start:done[0]]]))
                self.write_durably(f"writing the finished stages of run {run.run_id}", batch)
                progress.written, progress.row = done, True

    def flush(self) -> None:
        """Write every queued run now (and every finished stage of running "stage" runs); raise what
        went wrong since the last flush."""
        with self._flushes_lock:
            self._flushes += 1
        try:
            if self.inflight:
                self.materialize()
            self._write_beside()
            self.drain()
        finally:
            with self._flushes_lock:
                self._flushes -= 1
        failure = self.backlog.failure
        if failure is not None:
            raise StoreError(f"{failure} ({len(self.backlog)} runs queued)") from failure.__cause__
        if self.errors:
            errors, self.errors = self.errors, []
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise TracememError(f"{errors[0]}{more}") from errors[0]

    def stop(self) -> None:
        """Stop the background thread (after a final flush by the caller)."""
        self.backlog.close()
        if self._thread is not None:
            self._thread.join(timeout=30)
